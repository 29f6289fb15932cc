"""A model whose answers a script chooses, behind a real OpenAI-compatible chat-completions endpoint.

The reward audit (`groupwise.loop.audit`) sends chosen answers through a rollout exactly as a model's
would travel: the rollout's own `openai.AsyncOpenAI` client posts a chat-completions request, and an httpx
transport (no socket) answers it with the text the script returns for that request. So any rollout
written against the openai SDK runs unchanged, its parsing, tools and reward included.

``script(request) -> str | ScriptedCall``: `request` is the request body (``messages``, ``max_tokens``,
``tools``, ``tool_choice``, ...). A string is the assistant's content, cut to ``max_tokens`` words (a
model cannot write more than ``max_tokens`` tokens, and a word is at least one token; the answer's
``finish_reason`` is then ``"length"``). When the request carries tools and demands a call
(``tool_choice`` "required" or a named function), a string is sent as a call of the tool the request
names, else of the tool that looks like the final answer (``answer`` or ``final`` in its name): each of
its required string arguments holds the text, each list argument is empty. A `ScriptedCall` names the
tool and arguments itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ScriptedCall", "ScriptedModel", "cut_to_tokens", "tool_call_for"]


@dataclass(frozen=True)
class ScriptedCall:
    """A native tool call as the scripted answer."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


Script = Callable[[dict[str, Any]], "str | ScriptedCall"]


def cut_to_tokens(text: str, max_tokens: int | None) -> tuple[str, bool]:
    """(`text` cut to `max_tokens` whitespace-separated words, whether it was cut): what a model limited to
    `max_tokens` tokens could at most have written, since a word is one token or more."""
    if not max_tokens:
        return text, False
    words = text.split(" ")
    kept = [w for w in words if w]
    if len(kept) <= max_tokens:
        return text, False
    out, n = [], 0
    for w in words:
        if w:
            if n == max_tokens:
                break
            n += 1
        out.append(w)
    return " ".join(out), True


def _argument_for(schema: dict[str, Any], text: str) -> Any:
    kind = schema.get("type")
    if kind == "array":
        return []
    if kind in ("integer", "number"):
        return 0
    if kind == "boolean":
        return False
    if kind == "object":
        return {}
    return text


def tool_call_for(request: dict[str, Any], text: str) -> ScriptedCall | None:
    """The tool call that carries `text` when `request` demands one (module doc); None when it does not."""
    tools = [t.get("function", {}) for t in request.get("tools") or [] if isinstance(t, dict)]
    choice = request.get("tool_choice")
    if not tools or choice in (None, "auto", "none"):
        return None
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    by_name = {t.get("name"): t for t in tools}
    tool = by_name.get(named) or next(
        (t for t in tools if any(w in str(t.get("name", "")).lower() for w in ("answer", "final"))), tools[0])
    params = tool.get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required") or list(props)
    return ScriptedCall(str(tool.get("name")), {k: _argument_for(props.get(k, {}), text) for k in required})


class ScriptedModel:
    """What a rollout uses of a model (`name`, `inference_name()`, `openai_client()`), answering with
    `script`. Every request body is kept in `requests` (the audit reads the prompts from them)."""

    def __init__(self, script: Script, name: str = "scripted"):
        self.name = name
        self.script = script
        self.requests: list[dict[str, Any]] = []
        self._client: Any = None

    def inference_name(self) -> str:
        return self.name

    def _handle(self, request: Any) -> Any:
        import httpx

        body = json.loads(request.content)
        self.requests.append(body)
        reply = self.script(body)
        if isinstance(reply, str):
            reply, cut = cut_to_tokens(reply, body.get("max_tokens") or body.get("max_completion_tokens"))
            call = tool_call_for(body, reply)
        else:
            call, cut = reply, False
        message: dict[str, Any] = {"role": "assistant", "content": None if call else reply}
        if call is not None:
            message["tool_calls"] = [{"id": f"call_{len(self.requests)}", "type": "function",
                                      "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}]
        text = reply if call is None else json.dumps(call.arguments)
        choice = {"index": 0, "message": message, "logprobs": None,
                  "finish_reason": "tool_calls" if call else ("length" if cut else "stop")}
        n = max(1, len(text.split()))
        return httpx.Response(200, json={
            "id": f"chatcmpl-scripted-{len(self.requests)}", "object": "chat.completion", "created": 0,
            "model": body.get("model", self.name), "choices": [choice],
            "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n},
        })

    def openai_client(self) -> Any:
        """One client for every request (no socket behind it: the transport answers in process)."""
        if self._client is None:
            import httpx
            from openai import AsyncOpenAI

            http = httpx.AsyncClient(transport=httpx.MockTransport(self._handle))
            self._client = AsyncOpenAI(base_url="http://scripted.invalid/v1", api_key="scripted", http_client=http,
                                       max_retries=0)
        return self._client
