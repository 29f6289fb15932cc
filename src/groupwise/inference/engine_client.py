"""A frontend of an engine core process (engine_core.py): an `Engine` in the eyes of the server.

`EngineCoreClient` has the engine's face as the server, the registry and rollouts use it (`submit`
returning a future, ``on_token`` streaming, cancelling the future to abort, `add_adapter`,
`remove_adapter`, `retarget`, `adapters`, the limits, `tokenizer`, `close`), so `create_app` serves a
core process unchanged: the HTTP handling, chat rendering, tokenising, detokenising and responses run
in the frontend's process, and only token ids, sampling settings and adapter names cross (wire.py).

One I/O thread per client owns its DEALER socket (ZeroMQ sockets are not thread-safe): callers on any
thread queue their messages and wake it through a pipe; it resolves futures and calls ``on_token`` as
the engine's compute thread would. It also watches the core's pid: when the core dies, every pending
request and call fails at once with `EngineProcessDied`, naming the exit code, and later submits raise
it; nothing waits for an answer that cannot come.

`start_engine_core` starts a core process and returns its first frontend (which owns the process: its
`close` shuts the core down); `connect_engine_core` adds a frontend to a running core, from any process.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections import deque
from typing import Any

from groupwise.inference import wire
from groupwise.inference.engine_core import LIVENESS_S, CoreSpec, pid_exit, remove_core_address
from groupwise.inference.requests import (BASE, Completion, EngineError, GenerationRequest, GenerationResult,
                                          PromptTooLongError, RequestFailedError, RequestMemoryError, check_request)
from groupwise.runtime.dealer import exchange

__all__ = ["CONNECT_TIMEOUT_S", "EngineCoreClient", "EngineProcessDied", "connect_engine_core", "new_core_address", "start_engine_core"]


CONNECT_TIMEOUT_S = 30.0  # how long a frontend waits for a running core's answer to its hello


class EngineProcessDied(EngineError):
    """The engine core process is gone: its requests cannot finish (the message says how it ended)."""


def new_core_address() -> str:
    """A fresh ipc:// address: a socket in a folder of its own that only this user may enter (mode 0700),
    so no other local user can send the core requests or adapters; ipc paths are limited to ~100 bytes."""
    return f"ipc://{tempfile.mkdtemp(prefix='gw-core-')}/engine"


def _exited(process: subprocess.Popen) -> int | None:
    """`process`'s exit status as Popen writes it (-N: killed by signal N), None while it runs. Not reaped
    (WNOWAIT) where the OS allows: the core's other frontends, in other processes, read its exit code from
    /proc while it is a zombie (engine_core.pid_exit), until `close` reaps it."""
    if process.returncode is not None or not hasattr(os, "WNOWAIT"):
        return process.poll()
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return process.poll()
    if info is None:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _describe_exit(status: int | None, *, waitpid_status: bool) -> str:
    if status is None:
        return "its exit code is unknown (it was not started by this process)"
    if waitpid_status:  # /proc's exit_code: the signal in the low 7 bits, the code above
        sig, code = status & 0x7F, status >> 8
        status = -sig if sig else code
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"exit code {status} (killed by {name})"
    return f"exit code {status}"


class EngineCoreClient:
    """A frontend of the core at `address` (module doc). `process`: the core's process when this client
    started it (its exit code is then known exactly, and `close` shuts the core down)."""

    def __init__(self, address: str, tokenizer: Any, *, process: subprocess.Popen | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        import zmq

        self.tokenizer = tokenizer
        self.address = address
        self._process = process
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IDENTITY, f"{os.getpid()}-{uuid.uuid4().hex[:8]}".encode())
        self._sock.connect(address)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._lock = threading.Lock()
        self._outbox: deque[bytes] = deque()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[GenerationRequest, concurrent.futures.Future]] = {}
        self._calls: dict[int, concurrent.futures.Future] = {}
        self._adapters: set[str] = set()
        self.version = 0  # the policy version: the core's count of adapter changes
        self._dead: EngineError | None = None
        self._closing = False
        self._pipe_closed = False
        self.core_pid: int | None = process.pid if process is not None else None
        self._welcome(zmq, connect_timeout_s)
        self._thread = threading.Thread(target=self._main, name="groupwise-engine-client", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------ start-up
    def _welcome(self, zmq: Any, timeout_s: float) -> None:
        """Say hello and wait for the engine's limits. A core this client started may still be loading its
        model (minutes): no deadline, but its death is reported at once. A running core answers at once:
        nothing at `address` within `timeout_s` is an error, not a wait for ever."""
        import time

        deadline = time.monotonic() + timeout_s
        self._sock.send(wire.encode(wire.Hello(os.getpid())))
        while True:
            if self._sock.poll(int(LIVENESS_S * 1000), zmq.POLLIN):
                message = wire.decode_from_core(self._sock.recv())
                if isinstance(message, wire.Welcome):
                    break
                continue
            died = self._core_died()
            if died is None and self._process is None and time.monotonic() > deadline:
                died = EngineError(f"no engine core answered at {self.address} within {timeout_s:g} s; start one "
                                   "(start_engine_core) or pass the address a running one printed")
            if died is not None:
                self._close_socket()
                self._close_pipe()
                raise died
        self.core_pid = message.core_pid
        self.context_length = message.context_length
        self.vocab_size = message.vocab_size
        self.max_batch_size = message.max_batch_size
        self.max_new_tokens_default = message.max_new_tokens_default
        self.kv_budget_limits_context = message.kv_budget_limits_context
        self._adapters = set(message.adapters)
        self.version = message.version

    def _core_died(self) -> EngineProcessDied | None:
        if self._process is not None:
            status = _exited(self._process)
            if status is None:
                return None
            how = _describe_exit(status, waitpid_status=False)
        elif self.core_pid is not None:
            alive, status = pid_exit(self.core_pid)
            if alive:
                return None
            how = _describe_exit(status, waitpid_status=True)
        else:
            return None
        return EngineProcessDied(f"the engine core process (pid {self.core_pid}) died, {how}; its requests "
                                 "cannot finish. Its log (stderr) says why; restart the server (or the backend).")

    # ------------------------------------------------------------------------------ the engine's face
    @property
    def closed(self) -> bool:
        return self._dead is not None or self._closing

    @property
    def failure(self) -> EngineError | None:
        """Why this client can serve no more (`EngineProcessDied`: the core is gone), None while it can."""
        return self._dead

    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def _known_adapter(self, name: str) -> bool:
        return name in self._adapters

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Thread-safe: send `request` to the core; the future resolves to a `GenerationResult`, and
        cancelling it aborts the request in the core. The engine's own checks run here first, so a bad
        request raises at once, as `Engine.submit` does."""
        check_request(request, vocab_size=self.vocab_size, context_length=self.context_length,
                      max_batch_size=self.max_batch_size, kv_budget_limits_context=self.kv_budget_limits_context,
                      known_adapter=self._known_adapter, adapters=self.adapters)
        if self._dead is not None:
            raise self._dead
        if self._closing:
            raise EngineError("the engine client is closed")
        grammar = request.constraint
        rid = next(self._ids)
        message = wire.AddRequest(
            rid, list(request.prompt_ids),
            wire.Sampling(**dataclasses.asdict(request.sampling)),
            request.max_new_tokens, request.n, list(request.stop), list(request.stop_token_ids), request.ignore_eos,
            None if request.adapter == BASE else request.adapter, request.follow,
            None if grammar is None else grammar.grammar, "" if grammar is None else grammar.description,
            request.on_token is not None)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._pending[rid] = (request, future)
        future.add_done_callback(lambda f, rid=rid: self._cancelled(f, rid))
        self._post(wire.encode(message))
        return future

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        import asyncio

        return await asyncio.wrap_future(self.submit(request))

    def add_adapter(self, name: str, path: str | None = None, *, weights: dict[str, Any] | None = None,
                    config: Any = None) -> None:
        """Publish adapter `name` to the core (`Engine.add_adapter`): a folder, or `weights` with their peft
        `config` (sent as safetensors bytes)."""
        data = cfg = None
        if weights is not None:
            from safetensors.torch import save

            data = save({k: v.detach().to("cpu").contiguous() for k, v in weights.items()})
            cfg = config.to_dict() if hasattr(config, "to_dict") else dict(config)
            cfg = {k: sorted(v) if isinstance(v, set) else v for k, v in cfg.items()}
        self._call(lambda cid: wire.PublishAdapter(cid, name, None if path is None else str(path), data, cfg))

    def remove_adapter(self, name: str) -> None:
        self._call(lambda cid: wire.RemoveAdapter(cid, name))

    def retarget(self, follow: str, adapter: str) -> int:
        if adapter not in self._adapters:
            raise EngineError(f"adapter {adapter!r} is not loaded; loaded: {self.adapters()}")
        return self._call(lambda cid: wire.Retarget(cid, follow, adapter))

    def status(self) -> wire.CoreStatus:
        """The core's frontends and requests now (wire.CoreStatus)."""
        return self._call(lambda cid: wire.Status(cid))

    def _call(self, make: Any) -> Any:
        if self._dead is not None:
            raise self._dead
        cid = next(self._ids)
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._calls[cid] = future
        self._post(wire.encode(make(cid)))
        return future.result()

    def close(self) -> None:
        """Leave the core (its requests here are cancelled there); the client that started the core shuts
        it down and waits for its exit."""
        if self._closing:
            return
        self._closing = True
        if self._dead is None:
            self._post(wire.encode(wire.Shutdown() if self._process is not None else wire.Goodbye()))
        self._thread.join(timeout=10)
        self._close_pipe()
        self._fail_all(EngineError("the engine client was closed"))
        if self._process is not None:
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if isinstance(self._dead, EngineProcessDied):  # the core is gone and did not clean up: its socket's folder
            remove_core_address(self.address)

    def __enter__(self) -> "EngineCoreClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------ the I/O thread
    def _post(self, data: bytes) -> None:
        with self._lock:
            if self._pipe_closed:
                return
            self._outbox.append(data)
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # full of unread wake-ups: the thread is awake anyway
                pass

    def _cancelled(self, future: concurrent.futures.Future, rid: int) -> None:
        with self._lock:
            self._pending.pop(rid, None)
        if future.cancelled() and self._dead is None and not self._closing:
            self._post(wire.encode(wire.Abort([rid])))

    def _main(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while True:
                poller.poll(timeout=int(LIVENESS_S * 1000))
                for data in exchange(self._sock, self._wake_r, self._lock, self._outbox):
                    self._receive(wire.decode_from_core(data))
                if self._closing:
                    return
                if (died := self._core_died()) is not None:
                    self._dead = died
                    self._fail_all(died)
                    return
        except BaseException as exc:  # a bug here must fail the callers, never leave them waiting
            self._dead = EngineError(f"the engine client's I/O thread failed ({type(exc).__name__}: {exc}); "
                                     "its requests cannot finish")
            self._fail_all(self._dead)
            raise
        finally:
            self._close_socket()

    def _receive(self, message: Any) -> None:
        if isinstance(message, wire.Outputs):
            for d in message.deltas:
                entry = self._pending.get(d.request_id)
                if entry is not None and entry[0].on_token is not None:
                    last = len(d.token_ids) - 1
                    try:
                        for k, (token, logprob) in enumerate(zip(d.token_ids, d.logprobs)):
                            entry[0].on_token(d.index, token, logprob, d.finish_reason if k == last else None)
                    except Exception as exc:  # the caller's callback: its request fails, the others go on
                        _settle(entry[1], error=RequestFailedError(f"its on_token callback raised {type(exc).__name__}: {exc}"))
                        self._post(wire.encode(wire.Abort([d.request_id])))  # and stops in the core
            for f in message.finished:
                entry = self._pending.get(f.request_id)
                if entry is not None:
                    _settle(entry[1], result=GenerationResult(
                        [Completion(c.index, c.token_ids, c.logprobs, [[tuple(t) for t in top] for top in c.top_logprobs],
                                    c.text, c.finish_reason, c.forced_indices, c.adapters) for c in f.completions],
                        f.prompt_tokens, f.adapter))
            for f in message.failed:
                entry = self._pending.get(f.request_id)
                if entry is not None:
                    error = {"prompt_too_long": PromptTooLongError, "request_failed": RequestFailedError,
                             "memory": RequestMemoryError}.get(f.kind, EngineError)
                    _settle(entry[1], error=error(f.message))
        elif isinstance(message, wire.Adapters):
            self._adapters = set(message.adapters)
            self.version = message.version
        elif isinstance(message, wire.CoreStatus):
            with self._lock:
                future = self._calls.pop(message.call_id, None)
            if future is not None:
                _settle(future, result=message)
        elif isinstance(message, wire.Reply):
            with self._lock:
                future = self._calls.pop(message.call_id, None)
            if future is not None:
                _settle(future, result=message.result, error=None if message.error is None else EngineError(message.error))

    def _fail_all(self, error: EngineError) -> None:
        with self._lock:
            pending = [f for _, f in self._pending.values()] + list(self._calls.values())
            self._pending.clear()
            self._calls.clear()
        for future in pending:
            _settle(future, error=error)

    def _close_socket(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def _close_pipe(self) -> None:
        """Once the I/O thread has ended: under the lock, so no late `_post` writes to a reused fd."""
        with self._lock:
            if not self._pipe_closed:
                self._pipe_closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)


def _settle(future: concurrent.futures.Future, *, result: Any = None, error: BaseException | None = None) -> None:
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled by its caller meanwhile
        pass


def start_engine_core(model: str, *, tokenizer: Any = None, device: str | None = None, dtype: str | None = None,
                      engine_kwargs: dict[str, Any] | None = None, max_kv_gb: float | None = None,
                      load_model: str | None = None, address: str | None = None) -> EngineCoreClient:
    """Start an engine core process for `model` (engine_core.CoreSpec says what each argument is) and return
    its first frontend, which owns it. `tokenizer`: the frontend's (default: `load_tokenizer(model)`)."""
    if tokenizer is None:
        from groupwise.runtime.loading import load_tokenizer

        tokenizer = load_tokenizer(model)
    import msgspec

    spec = CoreSpec(model=model, address=address or new_core_address(), owner_pid=os.getpid(), device=device,
                    dtype=dtype, engine_kwargs=dict(engine_kwargs or {}), max_kv_gb=max_kv_gb, load_model=load_model)
    # A session of its own: a Ctrl-C reaches its owner, which stops its frontends before the core (the
    # core also exits once its owner is gone).
    process = subprocess.Popen([sys.executable, "-m", "groupwise.inference.engine_core"], stdin=subprocess.PIPE,
                               start_new_session=True)
    assert process.stdin is not None
    process.stdin.write(msgspec.msgpack.encode(spec))
    process.stdin.close()
    return EngineCoreClient(spec.address, tokenizer, process=process)


def connect_engine_core(address: str, tokenizer: Any) -> EngineCoreClient:
    """One more frontend of the running core at `address` (any process of this host)."""
    return EngineCoreClient(address, tokenizer)
