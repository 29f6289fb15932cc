"""Messages and tools through the tokenizer's chat template: the one rendering server and trainer share.

Both go through `prepare_messages` first (tool calls written as the model writes them, tools in the
system prompt for a template without tool support), so a conversation is rendered the same way
whoever renders it. The server asks for prompt ids with the generation prompt; the trainer asks for
the text of a whole conversation (its sampled turns are spliced in as ids, training/tokenize.py).
"""

from __future__ import annotations

import inspect
from typing import Any

from groupwise.chat.tool_calls import prepare_messages
from groupwise.errors import InvalidDataError

__all__ = ["prompt_ids", "render_text", "template_kwargs_problem"]

# A request's `chat_template_kwargs` are the template's variables. Refused: the arguments of
# `apply_chat_template` (its own template: Jinja run on the engine's thread; truncation or padding: a
# prompt other than the one the trainer renders; ...) and the messages themselves. Let through: the
# arguments the server sets anyway (its values win) and `documents`, data a template renders.
_NOT_VARIABLES = frozenset({"messages", "conversation", "tokenizer_kwargs", "processor_kwargs"})
_LET_THROUGH = frozenset({"tools", "add_generation_prompt", "tokenize", "return_dict", "documents"})


def render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
                add_generation_prompt: bool = False) -> str:
    """The chat-template text of `messages` with `tools` (None or [] for none)."""
    msgs, template_tools = prepare_messages(messages, tools, tokenizer)
    kwargs = {"add_generation_prompt": True} if add_generation_prompt else {}
    return tokenizer.apply_chat_template(msgs, tools=template_tools, tokenize=False, **kwargs)


def template_kwargs_problem(tokenizer: Any, template_kwargs: dict[str, Any] | None) -> str | None:
    """Why `template_kwargs` (a request's ``chat_template_kwargs``) cannot be passed to the template, or
    None. Only the template's own variables may be (Qwen3's ``enable_thinking``): not an argument of
    `apply_chat_template` in the installed transformers (``chat_template``, ``truncation``, ...)."""
    if not template_kwargs:
        return None
    arguments = {name for name, param in inspect.signature(tokenizer.apply_chat_template).parameters.items()
                 if param.kind not in (param.VAR_KEYWORD, param.VAR_POSITIONAL)}
    refused = sorted(set(template_kwargs) & ((arguments - _LET_THROUGH) | _NOT_VARIABLES))
    if refused:
        return (f"chat_template_kwargs may only hold the chat template's own variables (e.g. enable_thinking); "
                f"{refused} are arguments of the tokenizer's rendering, which the server sets")
    return None


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
               template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The prompt token ids of a chat request: the conversation and the assistant's generation prompt.
    `template_kwargs` are the template's own variables (vLLM's `chat_template_kwargs`, e.g. Qwen3's
    `enable_thinking`); the arguments that shape the rendering stay these."""
    problem = template_kwargs_problem(tokenizer, template_kwargs)
    if problem is not None:
        raise InvalidDataError(problem)
    msgs, template_tools = prepare_messages(messages, tools, tokenizer)
    ids = tokenizer.apply_chat_template(msgs, **{**(template_kwargs or {}), "tools": template_tools,
                                                 "add_generation_prompt": True, "tokenize": True,
                                                 "return_dict": True})["input_ids"]
    return list(ids)
