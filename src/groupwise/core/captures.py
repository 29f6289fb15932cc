"""A rollout's trajectory captured instead of returned: ART's automatic trajectories and yielded ones.

``await capture_auto_trajectory(rollout(...))`` runs a rollout that never builds a Trajectory and
returns one made of the chat completions it made.

The rollout calls the model with any OpenAI client (its own ``AsyncOpenAI``, `model.openai_client()`,
a framework's client, blocking or not, streamed or not) and may score the result through
``auto_trajectory(required=True).reward = ...``. Every chat completion that ends while the capture is
current (a context variable, so the tasks the rollout starts are inside it and other rollouts are not)
is recorded from its HTTP request and response: the exact messages and tools the model saw and the
choice it returned, groupwise's token ids included, so the trajectory trains on the sampled tokens.
Calls become conversations as `groupwise.core.recording` says: the first is the trajectory's
``messages_and_choices``, the others its ``additional_histories``.

How the calls are seen: the `Client.send` and `AsyncClient.send` of httpx and of httpx2 (the openai
SDK 3.x's own HTTP library) get a wrapper the first time a capture starts (never at import), which
does nothing unless a capture is current. A streamed
response's bytes are kept as the client reads them and recorded when the stream ends; a stream the
rollout stops early records what it read.

``await capture_yielded_trajectory(rollout(...))`` runs a rollout that hands its Trajectory over with
``yield_trajectory(t)`` instead of returning it (a callback deep in an agent framework, say). As in
ART, ``yield_trajectory`` outside a capture is accepted and has no effect, so a rollout that both
yields and returns its trajectory also runs on its own; the last trajectory yielded wins.

The module is not ART's ``art.auto_trajectory``: that name is also the function's, and the package
resolves its names lazily, so a submodule of the same name would shadow the function once imported.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Literal, overload

from groupwise.errors import GroupwiseError
from groupwise.core.recording import ChatCall, call_from_bodies, conversations
from groupwise.core.trajectory import History, Trajectory

__all__ = ["auto_trajectory", "capture_auto_trajectory", "capture_yielded_trajectory", "yield_trajectory"]

log = logging.getLogger(__name__)


class _Capture:
    """The trajectory being built and the calls recorded into it."""

    def __init__(self) -> None:
        self.trajectory = Trajectory()
        self.calls: list[ChatCall] = []
        self._histories: list[History] = []  # the ones this capture put in additional_histories
        self._lock = threading.Lock()  # a blocking client may record from a worker thread

    def record(self, request_body: bytes, response_body: bytes, streamed: bool) -> None:
        try:
            request = json.loads(request_body)
            if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
                return
            call = call_from_bodies(request, _streamed_response(response_body) if streamed
                                    else json.loads(response_body))
        except (ValueError, KeyError, IndexError, TypeError) as exc:  # not a chat completion we can read
            log.debug("capture_auto_trajectory skipped a response it could not read: %s", exc)
            return
        with self._lock:
            self.calls.append(call)
            found = conversations(self.calls)
            t = self.trajectory
            t.messages_and_choices = found[0].messages_and_choices
            t.tools = found[0].tools
            mine = {id(h) for h in self._histories}
            self._histories = found[1:]
            t.additional_histories = [*(h for h in t.additional_histories if id(h) not in mine), *self._histories]


def _streamed_response(body: bytes) -> dict[str, Any]:
    """A streamed chat completion's SSE bytes as the JSON a plain call returns (`groupwise.core.chat_stream`)."""
    from openai.types.chat.chat_completion_chunk import ChatCompletionChunk

    from groupwise.core.chat_stream import init_chat_completion, update_chat_completion

    completion = None
    # SSE lines end at CR, LF or CRLF, never at U+2028 or NEL (str.splitlines), which a server's JSON may hold raw
    for line in body.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = line.strip()
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        payload = json.loads(line[5:])
        if not isinstance(payload, dict) or "choices" not in payload:  # an in-band error event
            continue
        chunk = ChatCompletionChunk.model_validate(payload)
        if completion is None:
            completion = init_chat_completion(chunk)
        update_chat_completion(completion, chunk)
    return completion.model_dump() if completion is not None else {"choices": []}


_current: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("groupwise_auto_trajectory", default=None)
_installed = False
_install_lock = threading.Lock()


def _is_chat_completion(request: Any) -> bool:
    return request.method == "POST" and request.url.path.rstrip("/").endswith("chat/completions")


def _watch(capture: _Capture, request: Any, response: Any, streamed: bool) -> None:
    try:
        body = request.content
    except Exception:  # a request streamed from a generator (an upload): not a chat completion
        return
    if response.status_code != 200:
        return
    if not streamed:  # `send` read the whole body
        capture.record(body, response.content, streamed=False)
        return
    seen: list[bytes] = []
    done = [False]

    def finish() -> None:
        if not done[0]:
            done[0] = True
            capture.record(body, b"".join(seen), streamed=True)

    read_async, read_sync = response.aiter_bytes, response.iter_bytes

    async def aiter_bytes(chunk_size: int | None = None) -> AsyncIterator[bytes]:
        try:
            async for part in read_async(chunk_size):
                seen.append(part)
                yield part
        finally:
            finish()

    def iter_bytes(chunk_size: int | None = None) -> Iterator[bytes]:
        try:
            for part in read_sync(chunk_size):
                seen.append(part)
                yield part
        finally:
            finish()

    # On this response only: what the client reads is what it decoded (gzip and all).
    response.aiter_bytes = aiter_bytes
    response.iter_bytes = iter_bytes


# The HTTP libraries an OpenAI client may send with: httpx, and httpx2, the fork the openai SDK 3.x
# builds its default clients on. Both are wrapped; a missing one is skipped.
_HTTP_LIBRARIES = ("httpx", "httpx2")


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        for name in _HTTP_LIBRARIES:
            try:
                library = importlib.import_module(name)
            except ImportError:
                continue
            library.AsyncClient.send = _async_send(library.AsyncClient.send)
            library.Client.send = _sync_send(library.Client.send)
        _installed = True


def _async_send(send: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(send)
    async def wrapper(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        return _sent(request, await send(self, request, *args, **kwargs), kwargs)
    return wrapper


def _sync_send(send: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(send)
    def wrapper(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        return _sent(request, send(self, request, *args, **kwargs), kwargs)
    return wrapper


def _sent(request: Any, response: Any, send_kwargs: dict[str, Any]) -> Any:
    """`response`, watched for the current capture when it answers a chat completion."""
    capture = _current.get()
    if capture is not None and _is_chat_completion(request):
        _watch(capture, request, response, streamed=bool(send_kwargs.get("stream", False)))
    return response


@overload
def auto_trajectory(*, required: Literal[True]) -> Trajectory: ...


@overload
def auto_trajectory(*, required: bool = False) -> Trajectory | None: ...


def auto_trajectory(*, required: bool = False) -> Trajectory | None:
    """The trajectory `capture_auto_trajectory` is building for the running rollout (set its reward,
    metrics or metadata on it), or None outside one (``required=True``: an error instead)."""
    capture = _current.get()
    if capture is None:
        if required:
            raise GroupwiseError("auto_trajectory(required=True) was called outside capture_auto_trajectory: run "
                                 "the rollout as `await capture_auto_trajectory(rollout(...))`")
        return None
    return capture.trajectory


async def capture_auto_trajectory(coroutine: Coroutine[Any, Any, Any]) -> Trajectory:
    """Run `coroutine` (a rollout) and return the Trajectory of the chat completions it made, with
    what it set through `auto_trajectory()`; ``metrics["duration"]`` is the rollout's seconds."""
    _install()
    capture = _Capture()
    await _run_as(_current, capture, coroutine)
    return capture.trajectory.finish()


async def _run_as(var: contextvars.ContextVar, value: Any, coroutine: Coroutine[Any, Any, Any]) -> None:
    """Await `coroutine` with `var` set to `value` (the tasks it starts inherit it), then unset it."""
    token = var.set(value)
    try:
        await coroutine
    finally:
        var.reset(token)


class _Slot:
    trajectory: Trajectory | None = None


_yielded: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar("groupwise_yielded_trajectory", default=None)


def yield_trajectory(trajectory: Trajectory) -> None:
    """Hand `trajectory` to the `capture_yielded_trajectory` running this rollout."""
    if not isinstance(trajectory, Trajectory):
        raise GroupwiseError(f"yield_trajectory takes a Trajectory, got {type(trajectory).__name__}")
    slot = _yielded.get()
    if slot is not None:
        slot.trajectory = trajectory


async def capture_yielded_trajectory(coroutine: Coroutine[Any, Any, Any]) -> Trajectory:
    """Run `coroutine` and return the last Trajectory it passed to `yield_trajectory`."""
    slot = _Slot()
    await _run_as(_yielded, slot, coroutine)
    if slot.trajectory is None:
        raise GroupwiseError("the rollout ended without calling yield_trajectory(trajectory): yield the "
                             "Trajectory it built, or return it and await the rollout directly")
    return slot.trajectory
