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
  `multiprocessing` Pipe per worker (the child inherits its end): a command is (id, method name, keyword
  arguments) of `DeviceWorker` (a step's update, publish and retention: one typed command of
  backend/protocol.py, under ``command``), the answer (id, its pickled result or exception). One thread
  of the driver reads every pipe (`multiprocessing.connection.wait`) and hands each answer to the call
  that waits for its id; a worker that dies, even by SIGKILL, closes its end, so it is reported at once,
  with its exit signal, instead of leaving the driver waiting. A worker whose driver dies reads the end
  of its pipe and exits.
* a worker runs each command as a task of its own, as the in-process `DeviceWorker` runs the commands of
  several runs' tasks: one run's publication, which waits for its checkpoint's files on a thread, does
  not hold the pipe while the next run's update could use the device. Several ranks take one command at
  a time (the driver's lock): their updates meet in collectives, which must come in one order on every
  rank, and commands that overlap in a worker reach its locks in no fixed order.
* rollouts do not go through the driver: each worker serves its replica's FastAPI app with uvicorn on a
  loopback port, and the user's client spreads its requests over them (backend/routing.py). With
  ``WorkerOptions.engine_core`` (`LocalBackend(engine_process="separate")`) a worker serves its engine as an
  engine core instead, and the apps run in the driver's process over it (backend/frontends.py).
* such a worker of one device also takes the commands of drivers in other processes once asked to
  ("share": backend/sharing.py), each run's requests then in its own driver's process.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from groupwise.backend.driver import WorkerError
from groupwise.backend.sharing import SharedCommands, run_command
from groupwise.backend.worker import DeviceWorker, WorkerOptions


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _send(conn: Connection, obj: Any) -> None:
    # Plain pickle: multiprocessing's own pickler would pass tensors as shared-memory handles, which
    # only processes started by multiprocessing (sharing its auth key) can open.
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _deliver(entry: "tuple[Any, asyncio.Future, str] | None", reply: Any, error: BaseException | None) -> None:
    """From the reader thread: settle a waiting call's future on its loop (None: no call waits any more)."""
    if entry is None:
        return
    loop, future, _ = entry
    try:
        loop.call_soon_threadsafe(_settle, future, reply, error)
    except RuntimeError:  # its loop was closed (the caller's asyncio.run ended): nobody waits for the answer
        pass


def _settle(future: asyncio.Future, reply: Any, error: BaseException | None) -> None:
    """On the caller's loop: the answer (or the worker's death) to the call waiting for it, unless it gave up."""
    if future.done():
        return
    if error is None:
        future.set_result(reply)
    else:
        future.set_exception(error)


async def _answer(worker: DeviceWorker, conn: Any, cid: int, method: str, kwargs: dict[str, Any]) -> None:
    _send(conn, (cid, await run_command(worker, method, kwargs)))


async def _serve(worker: DeviceWorker, conn: Any) -> None:
    """Read commands and run each as a task (module doc); "close" runs once the commands before it ended;
    "share" opens the worker to drivers of other processes (backend/sharing.py) and answers its address."""
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task] = set()
    shared: SharedCommands | None = None
    try:
        while True:
            try:
                cid, method, kwargs = await loop.run_in_executor(None, _recv, conn)
            except (EOFError, OSError):  # the driver is gone: release everything and leave
                for task in running:
                    task.cancel()
                await asyncio.gather(*running, return_exceptions=True)
                await worker.close()
                return
            if method == "close":
                await asyncio.gather(*running, return_exceptions=True)
                await _answer(worker, conn, cid, method, kwargs)
                return
            if method == "share":
                if shared is None:
                    shared = SharedCommands(worker)
                _send(conn, (cid, ("ok", shared.address)))
                continue
            task = asyncio.create_task(_answer(worker, conn, cid, method, kwargs))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        if shared is not None:
            await shared.close()


_FD_VAR = "GROUPWISE_WORKER_FD"


def _worker_main() -> None:
    """A worker process: read its rank and settings from the pipe, then serve commands."""
    # Ctrl-C reaches every process of the terminal's group. The driver decides what it means (a step under
    # way ends at its checkpoint, then the driver closes this worker); a worker that stopped at once would
    # fail that step, and the drivers of a shared worker would wait on it. Its pipe's closing and the close
    # command end it, and so does its driver's death.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
        self._lock = asyncio.Lock()  # several ranks: one command at a time (module doc)
        self._failure: WorkerError | None = None
        self._ids = itertools.count()
        # (rank, command id) -> (the caller's loop, the future of its answer, the method): filled by `call`,
        # answered by the reader thread
        self._waiting: dict[tuple[int, int], tuple[Any, asyncio.Future, str]] = {}
        self._closed: set[int] = set()  # the ranks whose pipe the reader saw close
        self._stopping = threading.Event()

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
        threading.Thread(target=self._read, name="groupwise-worker-pipes", daemon=True).start()
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

    def _failed(self, rank: int, method: str, code: int | None) -> WorkerError:
        """Record that worker `rank` died during `method` (the first death is the one reported), stop the others."""
        if self._failure is None:
            pid = self._procs[rank].pid if rank < len(self._procs) else "?"
            self._failure = WorkerError(
                f"worker rank {rank} (device {self.devices[rank]}, pid {pid}) {_describe_exit(code)} during "
                f"{method!r}. The other workers were stopped. The run's last complete checkpoint is intact: "
                "create the backend again and register the model (or call fit again) to resume from it."
            )
        self._kill_all()
        return self._failure

    def _fail(self, rank: int, method: str, code: int | None) -> None:
        raise self._failed(rank, method, code)

    def kill(self) -> None:
        """Stop every worker now (no event loop needed)."""
        self._stopping.set()
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
        if rank >= len(self._procs):  # stopped meanwhile
            return None
        try:
            return self._procs[rank].wait(timeout=10)
        except subprocess.TimeoutExpired:
            return None

    def _read(self) -> None:
        """The reader thread: hand each worker's answers to the calls waiting for them; a closed pipe (the
        worker died) fails every call waiting on that worker."""
        closed = self._closed
        while not self._stopping.is_set():
            conns = {c: r for r, c in enumerate(self._conns) if r not in closed}
            if not conns:
                return
            try:
                ready = wait(list(conns), timeout=0.5)  # the timeout only lets it notice `stop`
            except (OSError, ValueError):  # a pipe closed by `kill` meanwhile
                continue
            for conn in ready:
                rank = conns[conn]
                try:
                    cid, reply = _recv(conn)
                except (EOFError, OSError, ValueError):
                    # a worker exits after "close"; one that dies unasked is found by the next call (`_call`)
                    # or by `check_alive`
                    closed.add(rank)
                    if not self._stopping.is_set():
                        self._worker_died(rank)
                    continue
                _deliver(self._waiting.pop((rank, cid), None), reply, None)

    def _worker_died(self, rank: int) -> None:
        """Worker `rank`'s pipe closed: if a call waits on it, fail every waiting call (nothing if none waits)."""
        method = next((entry[2] for key, entry in list(self._waiting.items()) if key[0] == rank), None)
        if method is None:
            return
        failure = self._failed(rank, method, self._exit_code(rank))
        for key in list(self._waiting):  # every worker was stopped: no call gets its answer
            _deliver(self._waiting.pop(key, None), None, failure)

    async def _answers(self, method: str, futures: dict[asyncio.Future, int]) -> list[Any]:
        """Wait for the answer of every called rank (the others: None). A worker that dies fails the call at
        once (its pipe closes). The ranks called do the same work, so once one has answered the others get
        `timeout_s` (30 s at most after an error: they may wait in a collective for the rank that failed);
        a rank that stays silent longer is stuck, and every worker is stopped."""
        results: list[Any] = [None] * len(self._conns)
        errors: list[tuple[int, BaseException, str]] = []
        pending = set(futures)
        while pending:
            answered = len(pending) < len(futures)
            timeout = min(self.timeout_s, 30.0) if errors else (self.timeout_s if answered else None)
            done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                await asyncio.to_thread(self._kill_all)
                silent = sorted(futures[f] for f in pending)
                self._failure = WorkerError(
                    f"worker rank(s) {silent} did not answer {method!r} within {timeout:.0f} s of the other ranks "
                    "(stopped, or stuck in a collective or a device call); every worker was stopped. The last "
                    "complete checkpoint is intact: create the backend again to resume from it.")
                if errors:  # the silent rank is the cause; the error of the rank that gave up is the context
                    raise self._failure from errors[0][1]
                raise self._failure
            for future in done:
                rank, reply = futures[future], future.result()  # a dead worker's WorkerError raises here
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
        (None for a rank not called). One worker's commands overlap; several ranks take one at a time
        (module doc)."""
        if len(self._conns) > 1:
            async with self._lock:
                return await self._call(method, kwargs)
        return await self._call(method, kwargs)

    async def _call(self, method: str, kwargs: "list[dict[str, Any] | None]") -> list[Any]:
        self.check_alive()
        loop = asyncio.get_running_loop()
        futures: dict[asyncio.Future, int] = {}
        keys = []
        try:
            for rank, kw in enumerate(kwargs):
                if kw is None:
                    continue
                cid, future = next(self._ids), loop.create_future()
                keys.append((rank, cid))
                self._waiting[(rank, cid)] = (loop, future, method)  # before the send: the answer may come first
                futures[future] = rank
                try:
                    _send(self._conns[rank], (cid, method, kw))
                except OSError:  # its end is closed: the worker died
                    self._fail(rank, method, self._exit_code(rank))
                if rank in self._closed:  # the reader saw its pipe close before this call waited on it
                    self._fail(rank, method, self._exit_code(rank))
            return await self._answers(method, futures)
        finally:
            for key in keys:
                self._waiting.pop(key, None)

    async def share(self) -> str:
        """Open the one worker to drivers in other processes of this host (backend/sharing.py, where a
        driver joins with `LocalBackend(join=address)`); its address. Asking again gives the same one."""
        [address] = await self.call("share", [{}])
        return address

    async def stop(self) -> None:
        self._stopping.set()
        for rank in range(len(self._procs)):
            await asyncio.to_thread(self._exit_code, rank)  # they exit after "close"
        self._kill_all()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


if __name__ == "__main__":
    _worker_main()
