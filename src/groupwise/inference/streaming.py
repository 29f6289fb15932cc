"""Server-sent events of a streaming chat completion (server.py), and the response that carries them.

The request is in the engine before the stream starts (so a bad one is a 400, not an in-band error);
tokens arrive through its ``on_token`` callback into an asyncio queue. When the stream ends for any
reason, the client's disconnect included, `EngineStream` cancels the request in the engine.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from groupwise.inference.engine import GenerationRequest
from groupwise.inference.responses import TokenTexts, policy_versions, token_entries, usage
from groupwise.chat.tool_calls import parse_tool_calls

__all__ = ["EngineStream", "stream_chat"]

log = logging.getLogger("groupwise.serve")


class EngineStream(StreamingResponse):
    """An SSE response whose engine request is cancelled when the response ends (finished, or the
    client went away: Starlette then cancels the stream)."""

    def __init__(self, content: AsyncIterator[str], future: concurrent.futures.Future):
        super().__init__(content, media_type="text/event-stream")
        self._future = future

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._future.cancel()  # no-op when it finished


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def stream_chat(texts: TokenTexts, future: concurrent.futures.Future, queue: asyncio.Queue, req: GenerationRequest,
                      header: dict[str, Any], parse_tools: bool, include_usage: bool,
                      tokens_as_ids: bool) -> AsyncIterator[str]:
    """SSE chunks: a role delta, text deltas with their logprobs and token ids, a finish chunk (with
    each choice's ``forced_token_indices``).

    With tools the text is held back and sent whole at the end (a tool call must be parsed
    complete); with stop strings, text that could still become a stop string is held back.
    """
    def chunk(choices: list[dict], usage_: dict | None = None) -> str:
        payload = {**header, "object": "chat.completion.chunk", "choices": choices}
        if usage_ is not None:
            payload["usage"] = usage_
        return _event(payload)

    task = asyncio.wrap_future(future)
    try:
        n = req.n
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                     for i in range(n)])
        ids: list[list[int]] = [[] for _ in range(n)]
        sent: list[int] = [0] * n  # characters of text already sent
        hold = max((len(s) for s in req.stop), default=1) - 1
        while not task.done() or not queue.empty():
            get = asyncio.ensure_future(queue.get())
            try:
                done, _ = await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
            finally:  # a client gone mid-wait cancels this generator here: its get must not outlive it
                if not get.done():
                    get.cancel()
            if get not in done:
                continue
            index, token, logprob = get.result()
            ids[index].append(token)
            delta: dict[str, Any] = {}
            if not parse_tools:
                text = texts.tokenizer.decode(ids[index], skip_special_tokens=True)
                # Send only text that cannot be part of a stop string: up to a stop string found,
                # else all but the last len(longest stop) - 1 characters.
                cuts = [text.find(stop) for stop in req.stop if stop in text]
                safe = min(cuts) if cuts else len(text) - hold
                if text.endswith("\ufffd"):  # an unfinished UTF-8 character: wait for the next token
                    safe = min(safe, len(text) - 1)
                if safe > sent[index]:
                    delta["content"] = text[sent[index]:safe]
                    sent[index] = safe
            entry = token_entries(texts, [token], [logprob], [], tokens_as_ids)
            yield chunk([{"index": index, "delta": delta, "logprobs": {"content": entry},
                          "token_ids": [token], "finish_reason": None}])
        result = await task
        finals = []
        for c in result.completions:
            delta = {}
            finish = c.finish_reason
            if parse_tools:
                content, calls = parse_tool_calls(c.text)
                if content:
                    delta["content"] = content
                if calls:
                    delta["tool_calls"] = [{**call, "index": k} for k, call in enumerate(calls)]
                    finish = "tool_calls" if finish == "stop" else finish
            elif len(c.text) > sent[c.index]:
                delta["content"] = c.text[sent[c.index]:]
            finals.append({"index": c.index, "delta": delta, "finish_reason": finish,
                           "forced_token_indices": c.forced_indices, **policy_versions(c)})
        yield chunk(finals)
        if include_usage:
            yield chunk([], usage(result))
    except Exception as exc:  # mid-stream the status is already 200: report in-band, like OpenAI
        log.error("a streamed request failed: %s: %s", type(exc).__name__, exc)
        yield _event({"error": {"message": "generation failed for this request (see the server log)",
                                "type": "server_error", "param": None, "code": "generation_failed"}})
    yield "data: [DONE]\n\n"
