"""A rollout's trajectory captured instead of returned: ART's automatic trajectories and yielded ones.

``await capture_auto_trajectory(rollout(...))`` runs a rollout that never builds a Trajectory and
returns one made of the model calls it made.

The rollout calls the model however it likes: the openai or anthropic SDK (blocking or not), a
framework's client, or raw HTTP through httpx, aiohttp or requests; over Chat Completions,
Completions, the Responses API or Anthropic's Messages API; streamed or not. It may score the result
through ``auto_trajectory(required=True).reward = ...``. Every call that ends while the capture is
current (a context variable, so the tasks the rollout starts are inside it and other rollouts are not)
is recorded from its HTTP request and answer: the exact messages and tools the model saw and the
choice it returned, groupwise's token ids and logprobs included, so the trajectory trains on the
sampled tokens. Calls become conversations as `groupwise.core.recording` says: the first is the
trajectory's ``messages_and_choices``, the others its ``additional_histories``.

Two layers, so that every transport records every protocol:
- one seam per HTTP library hands each POST and the body its caller read to the capture as an
  `Exchange`: httpx and httpx2 (the openai SDK 3.x's HTTP library; the anthropic SDK's httpx) at
  `Client.send` / `AsyncClient.send`; aiohttp at `ClientSession._request` (the one method its
  ``post``, ``request`` and ``async with`` forms share), its body read through the response's
  ``content``; requests at `Session.send`, a streamed body through ``iter_content`` (which
  ``iter_lines``, ``content`` and ``json()`` use). A streamed body is recorded when the caller has read
  it to its end, or what it read when it closes the response early. The seams are installed the first
  time a capture starts (never at import) and do nothing unless a capture is current; a request one
  seam records is not recorded again by a library below it (an httpx transport over aiohttp);
- one parser per protocol reads the exchange into a call (`groupwise.core.exchanges`).

The trajectory must be one history the reward judges. Calls to more than one model (the policy and a
judge, two policies) are refused unless ``model=`` names the one whose calls make the trajectory (the
others are left out); a history that branches (a call that goes back to an earlier sampled turn and
goes on differently) is refused unless ``branches=`` says which to keep ("last" or "split",
`groupwise.core.recording`). Either refusal is an `AmbiguousHistoryError` when the rollout ends.

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
import logging
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Literal, overload

from groupwise.core.adapter_names import split_served_name
from groupwise.core.exchanges import Exchange, call_of, protocol_of
from groupwise.core.recording import BRANCHES, Branches, ChatCall, conversations
from groupwise.core.trajectory import History, Trajectory
from groupwise.errors import AmbiguousHistoryError, GroupwiseError

__all__ = ["auto_trajectory", "capture_auto_trajectory", "capture_yielded_trajectory", "yield_trajectory"]

log = logging.getLogger(__name__)


class _Capture:
    """The trajectory being built and the calls recorded into it."""

    def __init__(self, model: str | None, branches: Branches) -> None:
        self.trajectory = Trajectory()
        self.model, self.branches = model, branches
        self.calls: list[ChatCall] = []
        self.error: AmbiguousHistoryError | None = None  # raised when the rollout ends, not inside its HTTP call
        self._histories: list[History] = []  # the ones this capture put in additional_histories
        self._lock = threading.Lock()  # a blocking client may record from a worker thread

    def record(self, exchange: Exchange) -> None:
        try:
            call = call_of(exchange)
        except (ValueError, KeyError, IndexError, TypeError, GroupwiseError) as exc:  # not a call we can read
            log.debug("capture_auto_trajectory skipped an answer it could not read: %s", exc)
            return
        if call is None or (self.model is not None and _model_name(call.model) != _model_name(self.model)):
            return
        with self._lock:
            self.calls.append(call)
            if self.error is not None:
                return
            try:
                self._check_models()
                found = conversations(self.calls, branches=self.branches)
            except AmbiguousHistoryError as exc:
                self.error = exc
                return
            t = self.trajectory
            t.messages_and_choices = found[0].messages_and_choices
            t.tools = found[0].tools
            mine = {id(h) for h in self._histories}
            self._histories = found[1:]
            t.additional_histories = [*(h for h in t.additional_histories if id(h) not in mine), *self._histories]

    def _check_models(self) -> None:
        models = sorted({_model_name(c.model) for c in self.calls}, key=str)
        if self.model is None and len(models) > 1:
            raise AmbiguousHistoryError(
                f"the rollout called {len(models)} models ({models}): a trajectory trains one policy. Name the "
                f"one to train, capture_auto_trajectory(..., model={models[0]!r}); the other models' calls are "
                "then left out of the trajectory")


def _model_name(model: str | None) -> str | None:
    """A request's model without its step: ``agent@3`` and ``agent`` are one policy's checkpoints."""
    return split_served_name(model)[0] if model else model


_current: contextvars.ContextVar[_Capture | None] = contextvars.ContextVar("groupwise_auto_trajectory", default=None)
# Set while a seam's library sends a request, so a library it sends through records nothing twice.
_recording: contextvars.ContextVar[bool] = contextvars.ContextVar("groupwise_capture_seam", default=False)
_installed = False
_install_lock = threading.Lock()


def _watched(method: str, path: str) -> _Capture | None:
    """The current capture, when a request of `method` to `path` is a model call it records."""
    capture = _current.get()
    if capture is None or _recording.get() or method.upper() != "POST" or protocol_of(path) is None:
        return None
    return capture


def _is_event_stream(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == "text/event-stream"


class _Reading:
    """The body a client reads of one answer, recorded once: at its end, or when the response closes."""

    def __init__(self, capture: _Capture, path: str, request: bytes, streamed: bool) -> None:
        self.capture, self.path, self.request, self.streamed = capture, path, request, streamed
        self.seen: list[bytes] = []
        self.done = False

    def add(self, part: bytes) -> None:
        if part and not self.done:
            self.seen.append(bytes(part))

    def finish(self) -> None:
        if not self.done:
            self.done = True
            self.capture.record(Exchange(self.path, self.request, b"".join(self.seen), self.streamed))


# ------------------------------------------------------------------------------------------- httpx


def _httpx_sent(request: Any, response: Any, send_kwargs: dict[str, Any]) -> Any:
    """`response`, watched for the current capture when it answers a model call."""
    capture = _watched(request.method, request.url.path)
    if capture is None or response.status_code != 200:
        return response
    try:
        body = request.content
    except Exception:  # a request streamed from a generator (an upload): not a model call
        return response
    reading = _Reading(capture, request.url.path, body, _is_event_stream(response.headers.get("content-type")))
    if not send_kwargs.get("stream", False):  # `send` read the whole body
        reading.add(response.content)
        reading.finish()
        return response
    read_async, read_sync = response.aiter_bytes, response.iter_bytes

    async def aiter_bytes(chunk_size: int | None = None) -> AsyncIterator[bytes]:
        try:
            async for part in read_async(chunk_size):
                reading.add(part)
                yield part
        finally:
            reading.finish()

    def iter_bytes(chunk_size: int | None = None) -> Iterator[bytes]:
        try:
            for part in read_sync(chunk_size):
                reading.add(part)
                yield part
        finally:
            reading.finish()

    close_async, close_sync = response.aclose, response.close

    async def aclose() -> None:
        reading.finish()
        await close_async()

    def close() -> None:
        reading.finish()
        close_sync()

    # On this response only: what the client reads is what it decoded (gzip and all). An SDK that stops
    # reading at the stream's last event closes the response with the byte iterator left open: the close
    # records it, in the order the calls ended.
    response.aiter_bytes, response.iter_bytes = aiter_bytes, iter_bytes
    response.aclose, response.close = aclose, close
    return response


def _httpx_async_send(send: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(send)
    async def wrapper(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        token = _recording.set(_current.get() is not None)
        try:
            response = await send(self, request, *args, **kwargs)
        finally:
            _recording.reset(token)
        return _httpx_sent(request, response, kwargs)
    return wrapper


def _httpx_sync_send(send: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(send)
    def wrapper(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        token = _recording.set(_current.get() is not None)
        try:
            response = send(self, request, *args, **kwargs)
        finally:
            _recording.reset(token)
        return _httpx_sent(request, response, kwargs)
    return wrapper


# ------------------------------------------------------------------------------------------- requests


def _requests_send(send: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(send)
    def wrapper(self: Any, request: Any, **kwargs: Any) -> Any:
        from urllib.parse import urlsplit

        path = urlsplit(request.url or "").path
        capture = _watched(request.method or "", path)
        if capture is None:
            return send(self, request, **kwargs)
        token = _recording.set(True)
        try:
            response = send(self, request, **kwargs)
        finally:
            _recording.reset(token)
        body = request.body if isinstance(request.body, bytes) else (request.body or "").encode() \
            if isinstance(request.body, str) else None
        if body is None or response.status_code != 200:
            return response
        reading = _Reading(capture, path, body, _is_event_stream(response.headers.get("content-type")))
        if not kwargs.get("stream"):  # `send` read the whole body
            reading.add(response.content)
            reading.finish()
            return response
        iter_content, close = response.iter_content, response.close

        def recorded(chunk_size: int | None = 1, decode_unicode: bool = False) -> Iterator[Any]:
            try:
                for part in iter_content(chunk_size, decode_unicode=False):
                    reading.add(part)
                    yield part.decode(response.encoding or "utf-8", errors="replace") if decode_unicode else part
            finally:
                reading.finish()

        def closed() -> None:
            reading.finish()
            close()

        # On this response only: `iter_lines`, `content`, `text` and `json()` all read through iter_content.
        response.iter_content, response.close = recorded, closed
        return response
    return wrapper


# ------------------------------------------------------------------------------------------- aiohttp


def _aiohttp_request(request: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(request)
    async def wrapper(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
        import json

        import yarl

        url = yarl.URL(str(str_or_url)) if not isinstance(str_or_url, yarl.URL) else str_or_url
        capture = _watched(method, url.path)
        if capture is None:
            return await request(self, method, str_or_url, **kwargs)
        token = _recording.set(True)
        try:
            response = await request(self, method, str_or_url, **kwargs)
        finally:
            _recording.reset(token)
        data = kwargs.get("data")
        body = (json.dumps(kwargs["json"]).encode() if kwargs.get("json") is not None
                else data if isinstance(data, bytes) else data.encode() if isinstance(data, str) else None)
        if body is None or response.status != 200:
            return response
        reading = _Reading(capture, url.path, body, _is_event_stream(response.headers.get("Content-Type")))
        response.content = _RecordedStream(response.content, reading)
        release, close = response.release, response.close

        def released(*args: Any, **kw: Any) -> Any:
            reading.finish()
            return release(*args, **kw)

        def closed(*args: Any, **kw: Any) -> Any:
            reading.finish()
            return close(*args, **kw)

        response.release, response.close = released, closed
        return response
    return wrapper


class _RecordedStream:
    """An aiohttp response's body stream that keeps what its reader reads: every way of reading it
    (``read``, ``json()``, ``async for line``, ``iter_any``, ``iter_chunked``, ``readchunk``) goes through
    the reading methods below; the rest is the stream's own."""

    def __init__(self, stream: Any, reading: _Reading) -> None:
        self._stream, self._reading = stream, reading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def _kept(self, data: bytes) -> bytes:
        self._reading.add(data)
        if not data or self._stream.at_eof():
            self._reading.finish()
        return data

    async def read(self, n: int = -1) -> bytes:
        return self._kept(await self._stream.read(n))

    async def readany(self) -> bytes:
        return self._kept(await self._stream.readany())

    async def readline(self) -> bytes:
        return self._kept(await self._stream.readline())

    async def readuntil(self, separator: bytes = b"\n") -> bytes:
        return self._kept(await self._stream.readuntil(separator))

    async def readexactly(self, n: int) -> bytes:
        return self._kept(await self._stream.readexactly(n))

    async def readchunk(self) -> tuple[bytes, bool]:
        data, end = await self._stream.readchunk()
        self._kept(data)
        return data, end

    def read_nowait(self, n: int = -1) -> bytes:
        data = self._stream.read_nowait(n)
        self._reading.add(data)
        return data

    def iter_any(self) -> Any:
        from aiohttp.streams import AsyncStreamIterator

        return AsyncStreamIterator(self.readany)

    def iter_chunked(self, n: int) -> Any:
        from aiohttp.streams import AsyncStreamIterator

        self._stream.set_read_chunk_size(n)
        return AsyncStreamIterator(lambda: self.read(n))

    def iter_chunks(self) -> Any:
        from aiohttp.streams import ChunkTupleAsyncStreamIterator

        return ChunkTupleAsyncStreamIterator(self)

    def __aiter__(self) -> Any:
        from aiohttp.streams import AsyncStreamIterator

        return AsyncStreamIterator(self.readline)


# ------------------------------------------------------------------------------------------- install


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        # httpx, and httpx2, the fork the openai SDK 3.x builds its default clients on
        for name in ("httpx", "httpx2"):
            try:
                library = importlib.import_module(name)
            except ImportError:
                continue
            library.AsyncClient.send = _httpx_async_send(library.AsyncClient.send)
            library.Client.send = _httpx_sync_send(library.Client.send)
        try:
            import requests
        except ImportError:
            pass
        else:
            requests.Session.send = _requests_send(requests.Session.send)
        try:
            import aiohttp
        except ImportError:
            pass
        else:
            aiohttp.ClientSession._request = _aiohttp_request(aiohttp.ClientSession._request)
        _installed = True


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


async def capture_auto_trajectory(coroutine: Coroutine[Any, Any, Any], *, model: str | None = None,
                                  branches: Branches = "refuse") -> Trajectory:
    """Run `coroutine` (a rollout) and return the Trajectory of the model calls it made, with what it set
    through `auto_trajectory()`; ``metrics["duration"]`` is the rollout's seconds.

    `model`: the model whose calls make the trajectory (``"agent"`` takes ``agent@k`` too); calls to
    others are left out. None: every call is recorded, and calls to two models are refused.
    `branches`: a history that branches is refused ("refuse"), kept as one history per branch
    ("split"), or only its latest branch is kept ("last"). A refusal is an `AmbiguousHistoryError`
    raised when the rollout ends, saying which argument to pass."""
    if branches not in BRANCHES:
        raise GroupwiseError(f"capture_auto_trajectory(branches={branches!r}): use one of {list(BRANCHES)}")
    if model is not None and not isinstance(model, str):
        raise GroupwiseError(f"capture_auto_trajectory(model={model!r}): pass the model's name, e.g. model.name")
    _install()
    capture = _Capture(model, branches)
    await _run_as(_current, capture, coroutine)
    if capture.error is not None:
        raise capture.error
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
