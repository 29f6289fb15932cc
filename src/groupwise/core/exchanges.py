"""One model call as an HTTP transport saw it, read by the parser of its protocol into a `ChatCall`.

`capture_auto_trajectory` (groupwise.core.captures) watches the HTTP libraries an agent may call a model
with; each gives an `Exchange`: the request's path and body, and the answer's body (the bytes the
client read, server-sent events when the answer was streamed). `call_of` hands it to the parser of its
protocol, chosen by the path, so every transport records every protocol and a new protocol is one
parser here:

- ``/chat/completions``: the request's messages and tools; the answer's first choice (a stream put back
  together as `groupwise.core.chat_stream` does for a client);
- ``/completions``: the prompt, and the first choice's text with its token ids, logprobs and the
  ``prompt_token_ids`` groupwise's server returns: a completion has no messages, so it trains on the
  exact ids it was sampled from (`groupwise.training.tokenize`);
- ``/responses`` (OpenAI's Responses API) and ``/messages`` (Anthropic's Messages API): the chat
  messages and tools of the request and the Choice of the answer, by `groupwise.chat.protocols`'
  translation, the one the server renders the prompt with; a stream is read back to its final answer
  (Responses: the ``response.completed`` event's response; Messages: ``message_start``'s message, which
  carries the token data, with the text and tool inputs of the blocks' deltas).

An answer without a choice (an error body, an empty stream) gives None: nothing to record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from groupwise.chat.protocols import chat_messages, choice_from_answer, messages_to_chat, responses_to_chat
from groupwise.core.recording import ChatCall
from groupwise.core.trajectory import Choice

__all__ = ["Exchange", "call_of", "protocol_of", "sse_events"]


@dataclass(frozen=True)
class Exchange:
    """One POST to a model and its answer: what every transport seam hands over."""

    path: str  # the URL's path, e.g. "/v1/chat/completions"
    request: bytes  # the JSON body sent
    response: bytes  # the body the client read (decoded: gzip and all)
    streamed: bool  # the answer is server-sent events (its content type is text/event-stream)


def sse_events(body: bytes) -> list[tuple[str | None, Any]]:
    """(event name, data as JSON) of each event of a server-sent-events body; ``[DONE]`` and data that is
    not JSON are left out. Lines end at CR, LF or CRLF, never at U+2028 or NEL (str.splitlines), which a
    server's JSON may hold raw."""
    events: list[tuple[str | None, Any]] = []
    name: str | None = None
    data: list[str] = []

    def flush() -> None:
        nonlocal name
        if data:
            text = "\n".join(data)
            if text.strip() != "[DONE]":
                try:
                    events.append((name, json.loads(text)))
                except ValueError:
                    pass
        data.clear()
        name = None

    for line in body.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if not line.strip():
            flush()
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
    flush()
    return events


# ------------------------------------------------------------------------------------------- parsers


def _chat(request: dict[str, Any], body: bytes, streamed: bool) -> ChatCall | None:
    if not isinstance(request.get("messages"), list):
        return None
    answer = _chat_stream(body) if streamed else json.loads(body)
    if not answer.get("choices"):
        return None
    return ChatCall(messages=list(request["messages"]), tools=request.get("tools") or None,
                    choice=Choice.model_validate(answer["choices"][0]), model=_model(request))


def _chat_stream(body: bytes) -> dict[str, Any]:
    from openai.types.chat.chat_completion_chunk import ChatCompletionChunk

    from groupwise.core.chat_stream import init_chat_completion, update_chat_completion

    completion = None
    for _, payload in sse_events(body):
        if not isinstance(payload, dict) or "choices" not in payload:  # an in-band error event
            continue
        chunk = ChatCompletionChunk.model_validate(payload)
        if completion is None:
            completion = init_chat_completion(chunk)
        update_chat_completion(completion, chunk)
    return completion.model_dump() if completion is not None else {"choices": []}


def _completion(request: dict[str, Any], body: bytes, streamed: bool) -> ChatCall | None:
    prompt = request.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one prompt
    if not isinstance(prompt, (str, list)):
        return None
    chunks = [p for _, p in sse_events(body)] if streamed else [json.loads(body)]
    merged: dict[str, Any] | None = None
    for chunk in chunks:  # the first choice of each chunk, joined (a stream's chunks each carry a share)
        for c in (chunk or {}).get("choices") or []:
            if c.get("index", 0) != 0:
                continue
            if merged is None:
                merged = {"text": "", "token_ids": [], "token_logprobs": [], "finish_reason": None}
            merged["text"] += c.get("text") or ""
            merged["token_ids"] += c.get("token_ids") or []
            merged["token_logprobs"] += ((c.get("logprobs") or {}).get("token_logprobs") or [])
            for key in ("finish_reason", "prompt_token_ids", "forced_token_indices", "policy_versions"):
                if c.get(key) is not None:
                    merged[key] = c[key]
    if merged is None:
        return None
    choice = Choice.model_validate({
        "index": 0, "finish_reason": merged["finish_reason"] or "stop", "logprobs": None,
        "message": {"role": "assistant", "content": merged["text"]},
        **{k: merged[k] for k in ("token_ids", "token_logprobs", "prompt_token_ids", "forced_token_indices",
                                  "policy_versions") if merged.get(k)}})
    shown = prompt if isinstance(prompt, str) else ""  # a prompt of ids is in the choice's prompt_token_ids
    return ChatCall(messages=[{"role": "user", "content": shown}], tools=None, choice=choice, model=_model(request),
                    prompt_ids=merged.get("prompt_token_ids") or (list(prompt) if isinstance(prompt, list) else None))


def _responses(request: dict[str, Any], body: bytes, streamed: bool) -> ChatCall | None:
    if "input" not in request:
        return None
    answer: Any = json.loads(body) if not streamed else next(
        (p["response"] for _, p in reversed(sse_events(body)) if isinstance(p, dict)
         and p.get("type") in ("response.completed", "response.incomplete")), None)
    if not isinstance(answer, dict) or answer.get("object") != "response":
        return None
    tools = responses_to_chat({"model": "", **request}).get("tools")
    return ChatCall(messages=chat_messages(request), tools=tools, choice=choice_from_answer(answer),
                    model=_model(request))


def _messages(request: dict[str, Any], body: bytes, streamed: bool) -> ChatCall | None:
    if not isinstance(request.get("messages"), list):
        return None
    answer = _messages_stream(body) if streamed else json.loads(body)
    if not isinstance(answer, dict) or answer.get("type") != "message":
        return None
    tools = messages_to_chat({"model": "", "max_tokens": 1, **request}).get("tools")
    return ChatCall(messages=chat_messages(request), tools=tools, choice=choice_from_answer(answer),
                    model=_model(request))


def _messages_stream(body: bytes) -> dict[str, Any] | None:
    """The Message a Messages stream ends with: its start event's message (token data included), the
    blocks' text and tool inputs from their deltas, the stop reason from ``message_delta``."""
    message: dict[str, Any] | None = None
    partial: dict[int, str] = {}
    for _, event in sse_events(body):
        kind = event.get("type") if isinstance(event, dict) else None
        if kind == "message_start":
            message = {**event["message"], "content": []}
        elif message is None:
            continue
        elif kind == "content_block_start":
            index = event["index"]
            while len(message["content"]) <= index:
                message["content"].append(None)
            message["content"][index] = dict(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta.get("type") == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "message_delta":
            message.update({k: v for k, v in event.get("delta", {}).items() if v is not None})
    if message is None:
        return None
    for index, text in partial.items():
        message["content"][index]["input"] = json.loads(text) if text else {}
    message["content"] = [b for b in message["content"] if b is not None]
    return message


def _model(request: dict[str, Any]) -> str | None:
    model = request.get("model")
    return model if isinstance(model, str) else None


# The path each protocol answers on, most specific first ("/chat/completions" also ends in "/completions").
_PARSERS: tuple[tuple[str, str, Callable[[dict[str, Any], bytes, bool], ChatCall | None]], ...] = (
    ("chat/completions", "chat.completions", _chat),
    ("completions", "completions", _completion),
    ("responses", "responses", _responses),
    ("messages", "messages", _messages),
)


def protocol_of(path: str) -> str | None:
    """The protocol a POST to `path` speaks ("chat.completions", "completions", "responses", "messages"),
    or None for any other path (nothing a capture records)."""
    path = path.rstrip("/")
    for suffix, name, _ in _PARSERS:
        if path == suffix or path.endswith("/" + suffix):
            return name
    return None


def call_of(exchange: Exchange) -> ChatCall | None:
    """The call an exchange made, read by its protocol's parser; None when the path is no model call or
    the answer holds no choice. Raises ValueError (or KeyError, TypeError) on a body it cannot read."""
    name = protocol_of(exchange.path)
    if name is None:
        return None
    request = json.loads(exchange.request)
    if not isinstance(request, dict):
        return None
    parse = next(p for _, n, p in _PARSERS if n == name)
    return parse(request, exchange.response, exchange.streamed)
