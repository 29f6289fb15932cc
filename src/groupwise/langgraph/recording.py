"""The chat completions a rollout's LangChain model made, and the Trajectory they become.

Recording happens at the HTTP layer (`RecordingTransport`), not from LangChain's message objects:
LangChain keeps only the parts of a response it models (content, tool calls, the logprobs) and drops
the sampled token ids our server attaches to each choice, which training needs (token-in/token-out).
Below LangChain, the request body is the exact message list the model saw, in OpenAI's format, and
the response is the raw choice, extra fields included. Every call path LangChain has (`create`,
`parse` for structured output, bound tools) goes through the same transport.

Calls become conversations as `groupwise.core.recording` says (the first one is the trajectory's
`messages_and_choices`, the others its `additional_histories`, as ART's wrapper orders them).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx

from groupwise.errors import GroupwiseError
from groupwise.core.recording import ChatCall, conversations
from groupwise.core.trajectory import Trajectory

__all__ = ["RecordingTransport", "fill_trajectory"]


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
