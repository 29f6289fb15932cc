"""The chat completions a rollout's LangChain model made, and the Trajectory they become.

Recording happens at the HTTP layer (`RecordingTransport`), not from LangChain's message objects:
LangChain keeps only the parts of a response it models (content, tool calls, the logprobs) and drops
the sampled token ids our server attaches to each choice, which training needs (token-in/token-out).
Below LangChain, the request body is the exact message list the model saw, in OpenAI's format, and
the response is the raw choice, extra fields included. Every call path LangChain has (`create`,
`parse` for structured output, bound tools) goes through the same transport.

Calls become conversations: a call whose messages start with an earlier conversation (its messages
and the assistant turn it sampled) continues it; any other call starts a new one (a sub-agent, a
router, a summariser). The first conversation is the trajectory's `messages_and_choices`, the others
its `additional_histories`, as ART's wrapper orders them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from groupwise.errors import GroupwiseError
from groupwise.types import Choice, History, Trajectory, choice_to_message

__all__ = ["ChatCall", "RecordingTransport", "conversations", "fill_trajectory"]


@dataclass(frozen=True)
class ChatCall:
    """One chat completion: the messages and tools it was asked with, and the choice it returned."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    choice: Choice


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: compare their text
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _arguments(arguments: Any) -> Any:
    # LangChain parses a call's arguments and serialises them again when it sends the turn back,
    # so the spacing may differ from what the model wrote; the parsed value is what must match.
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _key(message: dict[str, Any]) -> tuple:
    """What must be equal for a sent message to be the one an earlier call saw or sampled."""
    calls = tuple(
        (c.get("id"), (c.get("function") or {}).get("name"), json.dumps(_arguments((c.get("function") or {})
                                                                                   .get("arguments")), sort_keys=True))
        for c in message.get("tool_calls") or []
    )
    return message.get("role"), _text(message.get("content")).strip(), calls, message.get("tool_call_id")


@dataclass
class _Conversation:
    items: list[Any]  # messages (dicts) and Choices, in order
    keys: list[tuple]  # _key of each item, a Choice as its assistant message
    tools: list[dict[str, Any]] | None


def conversations(calls: list[ChatCall]) -> list[History]:
    """The recorded calls as conversations, in the order each began (see the module docstring)."""
    found: list[_Conversation] = []
    for call in calls:
        keys = [_key(m) for m in call.messages]
        # the longest conversation this call extends (the latest one wins a tie: the most recent turn)
        best = None
        for conv in found:
            n = len(conv.keys)
            if n <= len(keys) and keys[:n] == conv.keys and (best is None or n >= len(best.keys)):
                best = conv
        choice_key = _key(choice_to_message(call.choice))
        if best is None:
            found.append(_Conversation([*call.messages, call.choice], [*keys, choice_key], call.tools))
        else:
            n = len(best.keys)
            best.items.extend([*call.messages[n:], call.choice])
            best.keys.extend([*keys[n:], choice_key])
            best.tools = call.tools if call.tools else best.tools
    return [History(messages_and_choices=c.items, tools=c.tools) for c in found]


def fill_trajectory(trajectory: Any, calls: list[ChatCall]) -> Trajectory:
    """Put the recorded conversations into the Trajectory the rollout returned (as ART's wrapper does:
    the first conversation replaces its messages, the others are appended to its histories)."""
    if not isinstance(trajectory, Trajectory):
        raise GroupwiseError(
            f"a rollout wrapped with wrap_rollout must return a groupwise Trajectory, got "
            f"{type(trajectory).__name__}; return gw.Trajectory(reward=..., metrics=...): its messages are "
            "filled from the model calls the agent made"
        )
    found = conversations(calls)
    if found:
        trajectory.messages_and_choices = found[0].messages_and_choices
        trajectory.tools = found[0].tools
        trajectory.additional_histories = [*trajectory.additional_histories, *found[1:]]
    return trajectory


class RecordingTransport(httpx.AsyncBaseTransport, httpx.BaseTransport):
    """An httpx transport that sends each request through `client` (the model's own
    `openai.AsyncOpenAI`: in process or over HTTP, spread over replicas, whatever the backend chose)
    and hands every successful chat completion to `record(request_body, response_body)`.

    LangChain builds its own openai clients; this transport, passed as their httpx clients, is how its
    requests reach the model's endpoint without LangChain knowing anything of groupwise.

    It serves sync clients too (`handle_request`): the request is run on `loop`, the event loop the
    rollout and the model's client live on, and the calling thread waits. LangGraph runs a sync node in
    a worker thread, so its `llm.invoke` works; a sync call made on the loop's own thread would wait
    for itself forever, so that one is refused with an error saying to await `ainvoke`.
    """

    def __init__(self, client: Any, record: Callable[[dict[str, Any], dict[str, Any]], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._client = client.with_options(max_retries=0)  # LangChain's own client retries
        self._record = record
        self._loop = loop
        self._base_path = httpx.URL(str(client.base_url)).path.rstrip("/")

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self._forward(request.url.path, await request.aread())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            raise GroupwiseError(
                "a blocking call (`invoke`) of init_chat_model's chat model was made on the event loop of the "
                "rollout, which also serves the model, so it would wait for itself: `await llm.ainvoke(...)` "
                "there (a sync LangGraph node may call `invoke`: LangGraph runs it in a worker thread)"
            )
        if self._loop.is_closed():
            raise GroupwiseError("the rollout's event loop has closed; call the chat model within the rollout")
        return asyncio.run_coroutine_threadsafe(self._forward(request.url.path, request.read()), self._loop).result()

    async def _forward(self, path: str, raw_body: bytes) -> httpx.Response:
        import openai

        body = json.loads(raw_body or b"null")
        if isinstance(body, dict) and body.get("stream"):
            raise GroupwiseError(
                "a streamed chat completion cannot be recorded into the trajectory (its token ids arrive in "
                "pieces LangChain does not keep); init_chat_model's model does not stream, so build the "
                "agent from it rather than from a model with streaming=True"
            )
        if path.startswith(self._base_path):
            path = path[len(self._base_path):]
        try:
            response = await self._client.post(path, cast_to=httpx.Response, body=body)
        except openai.APIStatusError as exc:  # LangChain's client turns the status into its own error
            response = exc.response
        content = response.content
        if response.status_code == 200 and path.rstrip("/").endswith("chat/completions"):
            self._record(body, json.loads(content))
        # the body is already decoded: drop the headers that describe its encoding on the wire
        headers = [(k, v) for k, v in response.headers.items()
                   if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
        return httpx.Response(response.status_code, headers=headers, content=content)


def call_from_bodies(request: dict[str, Any], response: dict[str, Any]) -> ChatCall:
    """A ChatCall from a chat completion's request and response JSON (the first choice: an agent
    continues with one)."""
    return ChatCall(messages=list(request.get("messages") or []), tools=request.get("tools") or None,
                    choice=Choice.model_validate(response["choices"][0]))
