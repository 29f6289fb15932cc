"""The chat layer: how a conversation (messages and tools) becomes the text and tokens a model sees.

The server renders every prompt with it and the trainer renders every trained conversation with it,
unconditionally, so the context the trainer scores is token for token the context the engine
sampled from (token-in/token-out). It sits below both: it imports neither inference/ nor training/
(nor backend/ or loop/), and it needs no torch, only a tokenizer object.

    render.py      messages + tools -> chat-template text (trainer) or prompt ids (server)
    tool_calls.py  tools into the prompt of a template without tool support; tool calls written as
                   text (Hermes ``<tool_call>``) and parsed back into OpenAI ``tool_calls``
"""

from groupwise.chat.render import prompt_ids, render_text, template_kwargs_problem
from groupwise.chat.tool_calls import format_tool_call, parse_tool_calls, prepare_messages, template_supports_tools

__all__ = ["format_tool_call", "parse_tool_calls", "prepare_messages", "prompt_ids", "render_text", "template_kwargs_problem",
           "template_supports_tools"]
