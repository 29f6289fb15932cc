"""Messages and tools through the tokenizer's chat template: the one rendering server and trainer share.

Both go through `prepare_messages` first (tool calls written as the model writes them, tools in the
system prompt for a template without tool support), so a conversation is rendered the same way
whoever renders it. The server asks for prompt ids with the generation prompt; the trainer asks for
the text of a whole conversation (its sampled turns are spliced in as ids, training/tokenize.py).
"""

from __future__ import annotations

from typing import Any

from groupwise.chat.tool_calls import prepare_messages

__all__ = ["prompt_ids", "render_text"]


def render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                add_generation_prompt: bool = False) -> str:
    """The chat-template text of `messages` with `tools` (None or [] for none)."""
    msgs, template_tools = prepare_messages(messages, tools, tokenizer)
    kwargs = {"add_generation_prompt": True} if add_generation_prompt else {}
    return tokenizer.apply_chat_template(msgs, tools=template_tools, tokenize=False, **kwargs)


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
               template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The prompt token ids of a chat request: the conversation and the assistant's generation prompt.
    `template_kwargs` are the template's own variables (vLLM's `chat_template_kwargs`, e.g. Qwen3's
    `enable_thinking`); the arguments that shape the rendering stay these."""
    msgs, template_tools = prepare_messages(messages, tools, tokenizer)
    ids = tokenizer.apply_chat_template(msgs, **{**(template_kwargs or {}), "tools": template_tools,
                                                 "add_generation_prompt": True, "tokenize": True,
                                                 "return_dict": True})["input_ids"]
    return list(ids)
