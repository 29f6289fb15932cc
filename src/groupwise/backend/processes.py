"""`WorkerProcesses`: one `DeviceWorker` (backend/worker.py) per device of this host, each in its own process.

Why these pieces:
* processes, not threads: each rank needs its own CUDA context, its own compute thread and its own
  torch.distributed rank. A worker is ``python -m groupwise.backend.processes`` started with
  `subprocess`: CUDA cannot be used in a forked child, and multiprocessing's "spawn" would import the
  user's script again in every worker (running an unguarded ``asyncio.run(main())`` once per GPU), so
  the user's script would need an ``if __name__ == "__main__"`` guard it does not need on one device.
* the gradient all-reduce between ranks is torch.distributed (NCCL between GPUs, gloo on CPUs), set up
  through a TCP rendezvous on loopback; its timeout bounds how long a rank waits for a dead peer.
* driver -> worker commands (load, train, serve a step, retention, close) go through one
  `multiprocessing` Pipe per worker (the child inherits its end): a command is (method name, keyword
  arguments) of `DeviceWorker` (a step's update, publish and retention: one typed command of
  backend/protocol.py, under ``command``), the answer its pickled result or exception. The driver waits on all pipes at
  once (`multiprocessing.connection.wait`); a worker that dies, even by SIGKILL, closes its end, so it
  is reported at once, with its exit signal, instead of leaving the driver waiting. A worker whose
  driver dies reads the end of its pipe and exits.
* rollouts do not go through the driver: each worker serves its replica's FastAPI app with uvicorn on a
  loopback port, and the user's client spreads its requests over them (backend/routing.py). With
  ``WorkerOptions.engine_core`` (`LocalBackend(engine_process="separate")`) a worker serves its engine as an
  engine core instead, and the apps run in the driver's process over it (backend/frontends.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import pickle
import signal
import socket
import subprocess
import sys
import traceback
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from groupwise.backend.driver import WorkerError
from groupwise.backend.worker import DeviceWorker, WorkerOptions


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _portable(exc: BaseException, tb: str) -> BaseException:
    """The exception itself when it survives pickling, else a WorkerError carrying its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return WorkerError(f"{type(exc).__name__}: {exc}\n{tb}")


def _send(conn: Connection, obj: Any) -> None:
    # Plain pickle: multiprocessing's own pickler would pass tensors as shared-memory handles, which
    # only processes started by multiprocessing (sharing its auth key) can open.
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


async def _serve(worker: DeviceWorker, conn: Any) -> None:
    loop = asyncio.get_running_loop()
    while True:
        try:
            method, kwargs = await loop.run_in_executor(None, _recv, conn)
        except (EOFError, OSError):  # the driver is gone: release everything and leave
            await worker.close()
            return
        try:
            result = await getattr(worker, method)(**kwargs)
            reply: tuple = ("ok", result)
        except BaseException as exc:  # the driver re-raises it
            tb = traceback.format_exc()
            reply = ("error", _portable(exc, tb), tb)
        _send(conn, reply)
        if method == "close":
            return


_FD_VAR = "GROUPWISE_WORKER_FD"


def _worker_main() -> None:
    """A worker process: read its rank and settings from the pipe, then serve commands."""
    conn = Connection(int(os.environ.pop(_FD_VAR)))
    rank, world_size, device, options, threads = _recv(conn)
    if device.startswith("cpu"):
        import torch

        torch.set_num_threads(threads)  # the ranks share the CPU's cores instead of oversubscribing them
    asyncio.run(_serve(DeviceWorker(rank, world_size, device, options), conn))


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is not answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class WorkerProcesses:
    """The worker processes of a data-parallel `LocalBackend` (module doc)."""

    def __init__(self, devices: list[str], options: WorkerOptions, *, timeout_s: float,
                 cpu_threads: int | None = None) -> None:
        self.devices = list(devices)
        self.cpu_threads = cpu_threads  # the torch threads the CPU ranks share (None: every core)
        self.options = options
        self.timeout_s = timeout_s
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._lock = asyncio.Lock()
        self._failure: WorkerError | None = None

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    async def start(self) -> None:
        world = len(self.devices)
        cpu_ranks = sum(d.startswith("cpu") for d in self.devices)
        threads = max(1, (self.cpu_threads or os.cpu_count() or 1) // max(1, cpu_ranks))
        # the worker imports the groupwise this driver runs, wherever it was imported from
        here = str(Path(__file__).resolve().parents[2])
        path = os.pathsep.join([here] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
        options = self.options
        for rank, device in enumerate(self.devices):
            parent, child = multiprocessing.Pipe()
            env = dict(os.environ, PYTHONPATH=path, **{_FD_VAR: str(child.fileno())})
            if device.startswith("cuda"):
                # The worker sees its GPU alone, as cuda:0: every thread's current device is the right one
                # (CUDA's current device is per thread, and the engine and trainer run on a thread of their own).
                index = int(device.partition(":")[2] or 0)
                env["CUDA_VISIBLE_DEVICES"] = visible[index] if visible else str(index)
                device = "cuda:0"
            proc = subprocess.Popen([sys.executable, "-m", "groupwise.backend.processes"], env=env,
                                    pass_fds=[child.fileno()])
            child.close()  # only the worker holds its end now: its death closes the pipe
            _send(parent, (rank, world, device, options, threads))
            self._procs.append(proc)
            self._conns.append(parent)
        init = f"tcp://127.0.0.1:{_free_port()}"
        await self.call("init_process_group", [{"init_method": init, "timeout_s": self.timeout_s}] * world)

    def check_alive(self, dying: "list[int] | tuple[int, ...]" = ()) -> None:
        """Raise the WorkerError of a worker that died (or of an earlier failure). `dying`: ranks seen to
        be exiting (their engine core's pid is gone: backend/frontends.py), waited for first, since a killed
        process's main thread can be gone while its other threads still end, and it cannot be reaped yet."""
        if self._failure is not None:
            raise self._failure
        for rank in dying:
            self._exit_code(rank)
        for rank, proc in enumerate(self._procs):
            if proc.poll() is not None:
                self._fail(rank, "serving", proc.returncode)

    def _fail(self, rank: int, method: str, code: int | None) -> None:
        proc = self._procs[rank]
        self._failure = WorkerError(
            f"worker rank {rank} (device {self.devices[rank]}, pid {proc.pid}) {_describe_exit(code)} during "
            f"{method!r}. The other workers were stopped. The run's last complete checkpoint is intact: "
            "create the backend again and register the model (or call fit again) to resume from it."
        )
        self._kill_all()
        raise self._failure

    def kill(self) -> None:
        """Stop every worker now (no event loop needed)."""
        self._kill_all()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []

    def _kill_all(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs:
            proc.wait(timeout=30)

    def _exit_code(self, rank: int) -> int | None:
        try:
            return self._procs[rank].wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def _collect(self, method: str, ranks: list[int]) -> list[Any]:
        """Wait for the answer of every rank of `ranks` (the others were not called: None). A worker that
        dies fails the call at once (its pipe closes). The ranks called do the same work, so once one
        has answered the others get `timeout_s` (30 s at most after an error: they may wait in a
        collective for the rank that failed); a rank that stays silent longer is stuck, and every
        worker is stopped."""
        pending = {r: self._conns[r] for r in ranks}
        results: list[Any] = [None] * len(self._conns)
        errors: list[tuple[int, BaseException, str]] = []
        while pending:
            answered = len(pending) < len(ranks)
            timeout = min(self.timeout_s, 30.0) if errors else (self.timeout_s if answered else None)
            ready = wait(list(pending.values()), timeout=timeout)
            if not ready:
                self._kill_all()
                silent = sorted(pending)
                self._failure = WorkerError(
                    f"worker rank(s) {silent} did not answer {method!r} within {timeout:.0f} s of the other ranks "
                    "(stopped, or stuck in a collective or a device call); every worker was stopped. The last "
                    "complete checkpoint is intact: create the backend again to resume from it.")
                if errors:  # the silent rank is the cause; the error of the rank that gave up is the context
                    raise self._failure from errors[0][1]
                raise self._failure
            for conn in ready:
                rank = next(r for r, c in pending.items() if c is conn)
                try:
                    reply = _recv(conn)
                except (EOFError, OSError):
                    self._fail(rank, method, self._exit_code(rank))
                del pending[rank]
                if reply[0] == "ok":
                    results[rank] = reply[1]
                else:
                    errors.append((rank, reply[1], reply[2]))
        if errors:
            rank, exc, tb = errors[0]
            raise exc from WorkerError(f"rank {rank} failed {method!r}:\n{tb}")
        return results

    async def call(self, method: str, kwargs: "list[dict[str, Any] | None]") -> list[Any]:
        """`DeviceWorker.<method>(**kwargs[r])` on every rank r whose kwargs are not None; the answers by rank
        (None for a rank not called) (module doc)."""
        async with self._lock:  # one command at a time per pipe
            self.check_alive()
            ranks = [r for r, kw in enumerate(kwargs) if kw is not None]
            for rank in ranks:
                try:
                    _send(self._conns[rank], (method, kwargs[rank]))
                except OSError:  # its end is closed: the worker died
                    self._fail(rank, method, self._exit_code(rank))
            return await asyncio.to_thread(self._collect, method, ranks)

    async def stop(self) -> None:
        for rank in range(len(self._procs)):
            await asyncio.to_thread(self._exit_code, rank)  # they exit after "close"
        self._kill_all()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


if __name__ == "__main__":
    _worker_main()
