"""One device's worker shared by the drivers of several processes: `LocalBackend.share()` and
`LocalBackend(join=address)`.

Why. With ``engine_process="separate"`` a worker process holds the model, the engine (as an engine core)
and the trainer, and one driver process sends it commands and runs every rollout request's Python. Several
runs on one backend then share that driver's one GIL: their requests, answers, tokenising and trajectory
writes take turns, though the machine has cores to spare. A run whose driver is a process of its own
(`LocalBackend(join=...)`) does all of that in parallel with the other runs', and only what must be
shared stays shared: the base weights, the engine that batches every run's requests, the device.

What crosses. The owner's worker binds a ZeroMQ ROUTER socket on a fresh ipc:// address (a folder only
this user may enter) when asked (`WorkerProcesses.share`); each joining driver is a DEALER. A message is a
pickled ``(id, method, kwargs)`` of `DeviceWorker`, the answer ``(id, ("ok", result) | ("error", exc,
traceback))``: the pipe's commands (backend/processes.py), over a socket several processes reach. Each
joining driver builds its own frontends of the worker's engine core (backend/frontends.py), so its rollout
requests never pass through the owner.

Who owns what. The owner's process started the worker and stops it; a joining driver's ``close`` only
drops its own runs (their adapters, optimizers and served steps), and so does the worker when a joining
driver dies (it watches each one's pid, as the engine core watches its frontends), while the other drivers
go on. When the worker dies, every joining driver's waiting and later commands fail with a `WorkerError`
naming how it ended. Only one device: several data-parallel ranks must take commands in one order, which
drivers in different processes cannot agree on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import pickle
import tempfile
import threading
import traceback
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from groupwise.backend.driver import WorkerError
from groupwise.backend.options import BackendOptions
from groupwise.inference.engine_core import LIVENESS_S, pid_exit
from groupwise.loop.lockstep import Lockstep
from groupwise.runtime.dealer import exchange

__all__ = ["JOIN_TIMEOUT_S", "WORKER_SETTINGS", "SharedCommands", "SharedLockstep", "SharedWorker", "join_problems",
           "new_worker_address"]

JOIN_TIMEOUT_S = 30.0  # how long a joining driver waits for the worker's answer to its hello
HELLO, DETACH = "hello", "detach"
# the joined runs' lockstep barrier (`LocalBackend.lockstep_member`)
ARRIVE, LEAVE, EXPECT = "lockstep_arrive", "lockstep_leave", "lockstep_expect"
# the pipe's own business: a joining driver neither starts a process group nor shares the worker again
REFUSED = frozenset({"init_process_group", "share", "close"})


# the worker's settings: a joining backend takes the sharing backend's (its `join` argument)
WORKER_SETTINGS = ("dtype", "max_batch_size", "engine_kwargs", "joint_updates", "load_model", "memory_budget_gb",
                   "train_workers", "verify_adapter")


def join_problems(join: Any, *, device: Any, devices: Any, engine_process: Any, options: BackendOptions) -> list[str]:
    """What `LocalBackend(join=...)` refuses: an address that is none, or a setting of the worker's own."""
    problems = []
    if not isinstance(join, str) or not join.startswith(("ipc://", "tcp://")):
        problems.append(f"join={join!r} is not an address `await backend.share()` returned (ipc://...)")
    given = [name for name, value in (("device", device), ("devices", devices)) if value is not None]
    if engine_process not in (None, "auto", "separate"):
        given.append(f"engine_process={engine_process!r}")
    defaults = BackendOptions()
    given += [name for name in WORKER_SETTINGS if getattr(options, name) != getattr(defaults, name)]
    if given:
        problems.append(f"join= takes the sharing backend's worker as it is: drop {', '.join(given)} (set them on "
                        "the backend that calls share())")
    return problems


def new_worker_address() -> str:
    """A fresh ipc:// address in a folder of its own that only this user may enter (mode 0700): no other
    local user can send the worker commands (they are pickles)."""
    return f"ipc://{tempfile.mkdtemp(prefix='gw-worker-')}/commands"


def _portable(exc: BaseException, tb: str) -> BaseException:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return WorkerError(f"{type(exc).__name__}: {exc}\n{tb}")


async def run_command(worker: Any, method: str, kwargs: dict[str, Any]) -> tuple:
    """`worker.<method>(**kwargs)` as an answer that pickles: ("ok", result) or ("error", exc, traceback)."""
    try:
        return ("ok", await getattr(worker, method)(**kwargs))
    except BaseException as exc:  # the driver re-raises it
        tb = traceback.format_exc()
        return ("error", _portable(exc, tb), tb)


@dataclass
class _Peer:
    """A joining driver, as the worker sees it: its pid, the runs it loaded, its commands running."""

    pid: int
    runs: set[str] = field(default_factory=set)
    tasks: set[asyncio.Task] = field(default_factory=set)
    arrivals: set[asyncio.Task] = field(default_factory=set)  # its runs waiting at the lockstep barrier


class SharedCommands:
    """The worker's side (module doc): runs on the worker's event loop beside the pipe's commands."""

    def __init__(self, worker: Any) -> None:
        import zmq
        import zmq.asyncio

        self.worker = worker
        self.address = new_worker_address()
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(self.address)
        self._peers: dict[bytes, _Peer] = {}
        # the joining drivers' runs in lockstep loops start each step's rollouts together (loop/lockstep.py)
        self.lockstep = Lockstep([])
        self._tasks = [asyncio.create_task(self._serve()), asyncio.create_task(self._watch())]

    async def _reply(self, identity: bytes, cid: int, reply: tuple) -> None:
        if identity in self._peers or reply[0] == "error":
            await self._sock.send_multipart([identity, pickle.dumps((cid, reply), protocol=pickle.HIGHEST_PROTOCOL)])

    async def _serve(self) -> None:
        while True:
            identity, data = await self._sock.recv_multipart()
            try:
                cid, method, kwargs = pickle.loads(data)
            except Exception:  # not a driver of this version: nothing to answer
                continue
            peer = self._peers.get(identity)
            if method == HELLO:
                self._peers[identity] = _Peer(int(kwargs["pid"]))
                await self._reply(identity, cid, ("ok", {"pid": os.getpid(), "device": str(self.worker.device),
                                                         "world_size": self.worker.world_size}))
            elif peer is None:
                await self._reply(identity, cid, ("error", WorkerError("say hello first"), ""))
            elif method == EXPECT and kwargs["name"] not in peer.runs:
                error = WorkerError(f"run {kwargs['name']!r} is not loaded by this driver: register its model first")
                await self._reply(identity, cid, ("error", error, ""))
            elif method in (ARRIVE, LEAVE, EXPECT):
                task = asyncio.create_task(self._gate(identity, cid, method, kwargs["name"]))
                peer.arrivals.add(task)
                task.add_done_callback(peer.arrivals.discard)
            elif method == DETACH:
                await self._drop(identity)
                await self._sock.send_multipart([identity, pickle.dumps((cid, ("ok", None)))])
            elif method in REFUSED or method.startswith("_") or not hasattr(self.worker, method):
                error = WorkerError(f"{method!r} is not a command a joining driver may send")
                await self._reply(identity, cid, ("error", error, ""))
            else:
                task = asyncio.create_task(self._answer(identity, peer, cid, method, kwargs))
                peer.tasks.add(task)
                task.add_done_callback(peer.tasks.discard)

    async def _answer(self, identity: bytes, peer: _Peer, cid: int, method: str, kwargs: dict[str, Any]) -> None:
        reply = await run_command(self.worker, method, kwargs)
        if method == "load" and reply[0] == "ok":
            # (a driver that died meanwhile has its runs unloaded once its commands end: this one too)
            peer.runs.add(kwargs["spec"].name)
        if method == "unload":
            peer.runs.discard(kwargs["name"])
            await self.lockstep.leave(kwargs["name"])
        await self._reply(identity, cid, reply)

    async def _gate(self, identity: bytes, cid: int, method: str, name: str) -> None:
        if method == ARRIVE:
            await self.lockstep.arrive(name)
        elif method == EXPECT:
            await self.lockstep.expect(name)
        else:
            await self.lockstep.leave(name)
        await self._reply(identity, cid, ("ok", None))

    async def _drop(self, identity: bytes) -> None:
        """A joining driver detached or died: its runs leave the lockstep (no run waits for them), its
        commands end, then its runs leave the worker."""
        peer = self._peers.pop(identity, None)
        if peer is None:
            return
        for name in sorted(peer.runs):
            await self.lockstep.leave(name)
        for task in peer.arrivals:  # a dead driver's arrival waits for nobody
            task.cancel()
        await asyncio.gather(*peer.arrivals, *peer.tasks, return_exceptions=True)
        for name in sorted(peer.runs):
            await run_command(self.worker, "unload", {"name": name})

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(LIVENESS_S)
            for identity, peer in list(self._peers.items()):
                if not pid_exit(peer.pid)[0]:
                    await self._drop(identity)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._sock.close(linger=0)
        self._ctx.term()
        path = self.address.removeprefix("ipc://")
        for remove in (os.unlink, os.rmdir):
            try:
                remove(path)
            except OSError:
                pass
            path = os.path.dirname(path)


class SharedWorker:
    """A joining driver's side (module doc): what `WorkerProcesses` is to the owner, for one shared rank.
    One I/O thread owns the DEALER socket (ZeroMQ sockets are not thread-safe); callers on any loop queue
    their commands and wait on futures it settles. It checks the worker's pid every `LIVENESS_S`."""

    def __init__(self, address: str, *, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.devices: list[str] = []
        self.worker_pid: int | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._outbox: deque[bytes] = deque()
        self._waiting: dict[int, tuple[concurrent.futures.Future, str]] = {}
        self._failure: WorkerError | None = None
        self._closing = False
        self._thread: threading.Thread | None = None

    @property
    def pids(self) -> list[int]:
        return [self.worker_pid] if self.worker_pid is not None else []

    async def start(self) -> None:
        import zmq

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.IDENTITY, f"{os.getpid()}-{uuid.uuid4().hex[:8]}".encode())
        self._sock.connect(self.address)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(target=self._main, name="groupwise-shared-worker", daemon=True)
        self._thread.start()
        hello = self._post(HELLO, {"pid": os.getpid()})
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(hello), self.timeout_s)
        except asyncio.TimeoutError:
            self.kill()
            raise WorkerError(f"no worker answered at {self.address} within {self.timeout_s:g} s: pass the address "
                              "that `await backend.share()` returned in a process that is still running") from None
        if reply[0] != "ok":
            self.kill()
            raise WorkerError(f"the worker at {self.address} refused this driver: {reply[1]}")
        self.worker_pid, self.devices = reply[1]["pid"], [reply[1]["device"]]

    def _post(self, method: str, kwargs: dict[str, Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        data = pickle.dumps((cid := next(self._ids), method, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self._failure is not None:
                raise self._failure
            self._waiting[cid] = (future, method)
            self._outbox.append(data)
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:  # the pipe is full of wake-ups: the thread is awake anyway
                pass
        return future

    async def call(self, method: str, kwargs: "list[dict[str, Any] | None]") -> list[Any]:
        """`DeviceWorker.<method>(**kwargs[0])` on the shared worker; "close" detaches (module doc)."""
        [kw] = kwargs
        if kw is None:
            return [None]
        reply = await asyncio.wrap_future(self._post(DETACH if method == "close" else method, kw))
        if reply[0] == "error":
            raise reply[1] from WorkerError(f"the shared worker failed {method!r}:\n{reply[2]}")
        return [reply[1]]

    def check_alive(self, dying: "list[int] | tuple[int, ...]" = ()) -> None:
        if self._failure is not None:
            raise self._failure
        failure = self._died()
        if failure is not None:
            raise failure

    def _died(self) -> WorkerError | None:
        if self.worker_pid is None:
            return None
        alive, status = pid_exit(self.worker_pid)
        if alive:
            return None
        how = ("ended" if status is None else f"was killed by signal {status & 0x7F}" if status & 0x7F
               else f"exited with code {status >> 8}")
        return WorkerError(f"the shared worker (pid {self.worker_pid}, at {self.address}) {how}: the process that "
                           "shares it closed its backend or died. This run's last complete checkpoint is intact: "
                           "join a running worker (or create a backend of your own) and register the model again.")

    def _main(self) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        linger = 0
        try:
            while True:
                poller.poll(timeout=int(LIVENESS_S * 1000))
                for data in exchange(self._sock, self._wake_r, self._lock, self._outbox):
                    cid, reply = pickle.loads(data)
                    with self._lock:
                        entry = self._waiting.pop(cid, None)
                    if entry is not None and not entry[0].done():
                        entry[0].set_result(reply)
                if self._closing:
                    linger = 500  # a last detach may still be on its way out
                    return
                if (failure := self._died()) is not None:
                    self._fail_all(failure)
                    return
        except BaseException as exc:  # a bug here must fail the callers, never leave them waiting
            self._fail_all(WorkerError(f"the shared worker's I/O thread failed ({type(exc).__name__}: {exc})"))
            raise
        finally:
            self._sock.close(linger=linger)
            self._ctx.term()

    def _fail_all(self, failure: WorkerError) -> None:
        with self._lock:
            self._failure = failure
            waiting = list(self._waiting.values())
            self._waiting.clear()
        for future, _ in waiting:
            if not future.done():
                future.set_exception(failure)

    def _stop_thread(self) -> None:
        self._closing = True
        if self._thread is not None:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
            self._thread.join(timeout=10)
            self._thread = None
            os.close(self._wake_r)
            os.close(self._wake_w)
        self._fail_all(self._failure or WorkerError("this backend closed its connection to the shared worker"))

    def kill(self) -> None:
        """Leave now, without a loop (ART's ``with LocalBackend()``): ask the worker to drop this driver's runs,
        without waiting for its answer, and close."""
        if self._thread is not None and self._failure is None:
            try:
                self._post(DETACH, {})
            except WorkerError:
                pass
        self._stop_thread()

    async def stop(self) -> None:
        await asyncio.to_thread(self._stop_thread)


class SharedLockstep:
    """A joined run's `Member` of the shared worker's lockstep barrier (`LocalBackend.lockstep_member`)."""

    def __init__(self, worker: SharedWorker, name: str) -> None:
        self.worker, self.name = worker, name

    async def arrive(self) -> None:
        await self.worker.call(ARRIVE, [{"name": self.name}])

    async def leave(self) -> None:
        await self.worker.call(LEAVE, [{"name": self.name}])

    async def expect(self) -> None:
        """Take part from now, before the first arrival (`Lockstep.expect`)."""
        await self.worker.call(EXPECT, [{"name": self.name}])
