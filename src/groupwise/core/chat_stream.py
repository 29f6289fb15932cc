"""A streamed chat completion put back together as the `ChatCompletion` a plain call returns (ART's
`art.openai`): `consume_chat_completion_stream(stream)` and its parts.

Chunks are merged by their choice's ``index``, not by position, so a stream with ``n > 1`` (each chunk
carrying one choice, in any order) gives each choice its own text, tool calls and logprobs. What
groupwise's server adds to a chunk's choice is kept: the sampled ``token_ids`` (one list per chunk)
are joined, so a streamed choice trains exactly as a plain one; the extras the last chunk carries
(``forced_token_indices``, the policy versions) are set on the choice as they arrive.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable
from typing import Any

from openai.types.chat.chat_completion import ChatCompletion, Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import ChatCompletionChunk
from openai.types.chat.chat_completion_message import ChatCompletionMessage

from groupwise.errors import InvalidDataError

__all__ = [
    "consume_chat_completion_stream",
    "consume_sync_chat_completion_stream",
    "init_chat_completion",
    "update_chat_completion",
]

JOINED_EXTRAS = ("token_ids",)  # per-token lists a chunk carries its share of


def _empty_choice(index: int, with_logprobs: bool) -> Choice:
    return Choice(index=index, finish_reason="stop", logprobs=ChoiceLogprobs() if with_logprobs else None,
                  message=ChatCompletionMessage(role="assistant"))


def init_chat_completion(chunk: ChatCompletionChunk) -> ChatCompletion:
    """An empty ChatCompletion with the stream's id, model and creation time, and a choice for each
    choice of its first chunk (`update_chat_completion` adds the text)."""
    return ChatCompletion(id=chunk.id, created=chunk.created, model=chunk.model, object="chat.completion",
                          system_fingerprint=chunk.system_fingerprint,
                          choices=[_empty_choice(c.index, c.logprobs is not None) for c in chunk.choices])


def _new_tool_call(kind: str | None) -> Any:
    # Built through the message's own field, so each openai release gives the tool-call class it has.
    message = ChatCompletionMessage.model_validate(
        {"role": "assistant",
         "tool_calls": [{"id": "", "type": kind or "function", "function": {"name": "", "arguments": ""}}]})
    return message.tool_calls[0]


def _add_tool_calls(message: ChatCompletionMessage, deltas: list[Any]) -> None:
    calls = message.tool_calls if message.tool_calls is not None else []
    for delta in deltas:
        while len(calls) <= delta.index:
            calls.append(_new_tool_call(delta.type))
        call = calls[delta.index]
        if delta.id:
            call.id = delta.id
        if delta.function is not None:
            call.function.name += delta.function.name or ""
            call.function.arguments += delta.function.arguments or ""
    message.tool_calls = calls


def update_chat_completion(chat_completion: ChatCompletion, chunk: ChatCompletionChunk) -> None:
    """Add one chunk's deltas to `chat_completion`, each to the choice of the same ``index``."""
    if chunk.usage is not None:
        chat_completion.usage = chunk.usage
    for part in chunk.choices:
        choice = next((c for c in chat_completion.choices if c.index == part.index), None)
        if choice is None:
            choice = _empty_choice(part.index, part.logprobs is not None)
            chat_completion.choices.append(choice)
            chat_completion.choices.sort(key=lambda c: c.index)
        if part.finish_reason is not None:
            choice.finish_reason = part.finish_reason
        delta, message = part.delta, choice.message
        if delta.content:
            message.content = (message.content or "") + delta.content
        if delta.refusal:
            message.refusal = (message.refusal or "") + delta.refusal
        if delta.tool_calls:
            _add_tool_calls(message, delta.tool_calls)
        if delta.function_call is not None:
            if message.function_call is None:
                message.function_call = ChatCompletionMessage.model_validate(
                    {"role": "assistant", "function_call": {"name": "", "arguments": ""}}).function_call
            message.function_call.name += delta.function_call.name or ""
            message.function_call.arguments += delta.function_call.arguments or ""
        if part.logprobs is not None:
            logprobs = choice.logprobs if choice.logprobs is not None else ChoiceLogprobs()
            for field in ("content", "refusal"):
                entries = getattr(part.logprobs, field)
                if entries:
                    setattr(logprobs, field, [*(getattr(logprobs, field) or []), *entries])
            choice.logprobs = logprobs
        for name, value in (part.model_extra or {}).items():
            if name in JOINED_EXTRAS and isinstance(value, list):
                setattr(choice, name, [*(getattr(choice, name, None) or []), *value])
            elif value is not None:
                setattr(choice, name, value)


async def consume_chat_completion_stream(
    stream: AsyncIterable[ChatCompletionChunk],
    on_chunk: Callable[[ChatCompletionChunk, ChatCompletion], Any] | None = None,
) -> ChatCompletion:
    """Read a streamed chat completion to its end and return it as one ChatCompletion.

    `on_chunk(chunk, completion_so_far)` sees each chunk as it arrives; raising StopIteration in it
    closes the stream and returns what came so far (ART's way to stop early).
    """
    completion: ChatCompletion | None = None
    async for chunk in stream:
        if completion is None:
            completion = init_chat_completion(chunk)
        update_chat_completion(completion, chunk)
        if on_chunk is not None:
            try:
                on_chunk(chunk, completion)
            except StopIteration:
                close = getattr(stream, "close", None)
                if close is not None:
                    await close()
                break
    if completion is None:
        raise InvalidDataError("the stream ended before its first chunk: there is no chat completion to return")
    return completion


def consume_sync_chat_completion_stream(stream: Iterable[ChatCompletionChunk]) -> ChatCompletion:
    """`consume_chat_completion_stream` for the blocking client's stream."""
    completion: ChatCompletion | None = None
    for chunk in stream:
        if completion is None:
            completion = init_chat_completion(chunk)
        update_chat_completion(completion, chunk)
    if completion is None:
        raise InvalidDataError("the stream ended before its first chunk: there is no chat completion to return")
    return completion
