"""One thread for the process's torch work: engine steps, model loading, training steps.

Why one. PyTorch's CPU ops run in OpenMP (libgomp) teams, one team per calling thread. When a
process's OpenMP threads outnumber its cores, libgomp makes idle workers sleep almost at once
instead of spinning, so every parallel region pays a futex wake-up. An engine decoding in one
thread while the model is loaded or trained in another is exactly that, and on a small CPU it slows
every matmul by half again; with one thread doing all torch work, the teams stay hot. GPUs are
unaffected.

So groupwise keeps one `ComputeThread` per process (`compute_thread()`): engines are stepped on it
(an engine is a poller here, not a thread: `Engine.poll` runs one step), and the backend sends its
loading, tokenizing, training and checkpoint work to it as tasks. Tasks and engine steps
interleave: each turn runs the queued tasks, then one step of every engine with work. A task must
not wait for an engine's answer (that engine steps on this same thread): it would wait forever.

On CUDA an update may run on a second thread (`update_thread`) while this one goes on stepping an engine
by decode-graph replays (`Engine.paused(decoding=True)`): several runs' requests then decode during another
run's update instead of waiting for it. Its tasks must not wait for this thread either.

Why it is stopped at exit. The thread is a daemon, so a program that fails (its exception leaves
`asyncio.run` with the backend never closed) still exits. But a daemon thread inside a torch kernel
while the interpreter finalizes makes the C++ runtime abort the process ("terminate called without
an active exception", SIGABRT, exit status 134) after the Python traceback, instead of exit status 1.
So an `atexit` hook stops the process's compute thread: it finishes the kernel it is in, runs no
further task or engine step (pending tasks are cancelled), and is joined before finalization.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections import deque
from typing import Any, Callable

from groupwise.errors import GroupwiseError

__all__ = ["ComputeThread", "compute_thread", "error_of", "update_thread", "usable_cores"]


class ComputeThread:
    """A daemon thread that runs submitted tasks and steps attached engines (module doc)."""

    def __init__(self, name: str = "groupwise-compute") -> None:
        self.cv = threading.Condition()  # engines attached here guard their queues with it too
        self._tasks: deque[tuple[concurrent.futures.Future, Callable[..., Any], tuple, dict]] = deque()
        self._engines: list[Any] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        """Run fn(*args, **kwargs) on the compute thread; the future holds its result or exception."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.cv:
            if self._stopping:  # at exit: fail at once rather than wait for a thread that has gone
                future.set_exception(GroupwiseError("the compute thread has stopped: the interpreter is exiting"))
                return future
            self._tasks.append((future, fn, args, kwargs))
            self.cv.notify_all()
        return future

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run fn on the compute thread and wait (directly when already on it)."""
        if self.on_thread():
            return fn(*args, **kwargs)
        return self.submit(fn, *args, **kwargs).result()

    async def run(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``await compute.run(fn, ...)``: fn on the compute thread, the event loop free meanwhile."""
        if self.on_thread():
            return fn(*args, **kwargs)
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def attach(self, engine: Any) -> None:
        with self.cv:
            self._engines.append(engine)
            self.cv.notify_all()

    def detach(self, engine: Any) -> None:
        with self.cv:
            if engine in self._engines:
                self._engines.remove(engine)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop after the work in hand (queued tasks are cancelled) and join; False if still running
        after `timeout` seconds. Used at interpreter exit (module doc)."""
        with self.cv:
            self._stopping = True
            for future, *_ in self._tasks:
                future.cancel()
            self._tasks.clear()
            self.cv.notify_all()
        if not self.on_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _main(self) -> None:
        while True:
            with self.cv:
                while not self._stopping and not self._tasks and not any(e.ready() for e in self._engines):
                    self.cv.wait()
                if self._stopping:
                    return
                tasks = list(self._tasks)
                self._tasks.clear()
                engines = list(self._engines)
            for future, fn, args, kwargs in tasks:
                if self._stopping or not future.set_running_or_notify_cancel():
                    continue
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as exc:  # the caller gets it; the thread keeps serving
                    future.set_exception(exc)
            for engine in engines:
                if self._stopping:
                    break
                engine.poll()


_threads: dict[str, ComputeThread] = {}  # name -> the process's thread of that name
_threads_lock = threading.Lock()


def _process_thread(name: str) -> ComputeThread:
    """The process's `ComputeThread` of this name: started on first use, stopped at exit (module doc)."""
    with _threads_lock:
        thread = _threads.get(name)
        if thread is None:
            thread = _threads[name] = ComputeThread(name)
            atexit.register(thread.stop, _EXIT_JOIN_TIMEOUT_S)
        return thread


def compute_thread() -> ComputeThread:
    """The process's compute thread (started on first use)."""
    return _process_thread("groupwise-compute")


def update_thread() -> ComputeThread:
    """The process's thread for a trainer's updates that run while the compute thread goes on stepping an
    engine (on CUDA, `Engine.paused(decoding=True)`): GPUs have no OpenMP teams to keep hot, and the
    engine's decode graphs and the update then share the device. Started on first use, stopped at exit."""
    return _process_thread("groupwise-update")


# How long exit waits for the kernel or task in hand: an engine step takes well under a second; a
# training update in hand when the program fails may take longer, and past this the process exits as
# it would without the hook (a Ctrl-C should not wait minutes).
_EXIT_JOIN_TIMEOUT_S = 60.0


async def error_of(future: asyncio.Future) -> BaseException | None:
    """Wait for `future` (work handed to another thread) and return its error instead of raising it: where
    a step fails already, that failure is the one raised, and this one is reported beside it, not lost."""
    await asyncio.wait([future])
    return None if future.cancelled() else future.exception()


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the OS has one, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
