"""A sweep's runs each driven by a process of its own (`groupwise train --seeds ... --run-processes each`).

Why. One process driving every run of a sweep runs all their per-request Python (the chat requests, the
answers, tokenising, trajectory writes) under one GIL, and the runs take turns there while the engine waits
for their next requests. A process per run does that work in parallel; only what must be shared stays shared
(the base weights, the engine that batches every run's requests, the trainer): the sweep's own backend holds
them in its worker and shares it (`LocalBackend.share()`), and each run's process joins it
(`LocalBackend(join=address)`, backend/sharing.py). Four runs of a 0.5B model on an H200 trained 1.97-2.16x
the tokens/s of the same runs in sequence so, against 1.82x from one process (docs/benchmarks.md).

How. Each run's process (spawned: a fresh interpreter, no CUDA state forked) rebuilds its run from the job,
registers and warm-starts it, says it takes part in the worker's lockstep barrier (`Lockstep.expect`), then
meets the others at a start barrier, so the first step of every run goes together; then `gw.fit_runs` of its
one run (its lines start with its name, as a sweep's do in one process). It sends its row of the final table
back over a pipe. A run that fails ends alone: its process reports the error as its row; a process that dies
without a row (killed, out of memory) gets a row saying how it ended, and the worker drops its run when it
sees the pid gone, while the other runs go on. An interrupt (Ctrl-C reaches every process of the terminal's
group) lets each run end its step at its checkpoint before the worker closes.

The rollouts' progress bars are off in the runs' processes (tqdm's own ``TQDM_DISABLE``): bars that several
processes redraw on one terminal line overwrite each other. Each run's step lines say where it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from groupwise.errors import GroupwiseError

__all__ = ["drive_each"]

END_GRACE_S = 120.0  # after an interrupt: how long the runs' processes have to finish their step


async def drive_each(job: Any, spec: Any, backend: Any, metric: str) -> list[dict[str, Any]]:
    """Train every run of `job` (a `TrainJob`) in a process of its own on `backend`'s worker, which this
    process shares; each run's row of the final table, in the job's order."""
    address = await backend.share()
    ctx = multiprocessing.get_context("spawn")
    runs = job.runs()
    start = ctx.Barrier(len(runs))
    procs, pipes = [], []
    try:
        for seed, lr in runs:
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=run_process, args=(job, seed, lr, address, start, send),
                               name=f"groupwise-run-s{seed}" + (f"-lr{lr:g}" if lr is not None else ""))
            with _environ(TQDM_DISABLE="1"):  # (module doc: the bars)
                proc.start()
            send.close()  # the child holds the only sending end: its exit ends our receive with EOFError
            procs.append(proc)
            pipes.append(receive)
        rows = await asyncio.to_thread(_collect, procs, pipes, start)
    except BaseException:
        start.abort()  # no run started waits for one that never will be
        raise
    finally:
        await asyncio.to_thread(_end, procs)
    from groupwise.jobs.train_setup import new_model, run_row

    out = []
    for (seed, lr), proc, row in zip(runs, procs, rows):
        if row is None:
            how = (f"was killed by signal {-proc.exitcode}" if proc.exitcode and proc.exitcode < 0
                   else f"exited with code {proc.exitcode}")
            failure = GroupwiseError(f"the run's process {how} before it reported; its last complete checkpoint "
                                     "is intact (the same command resumes it)")
            row = run_row(new_model(job, spec, seed, lr), seed, job.preset(lr), 0, failure, metric)
        out.append(row)
    return out


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """These environment variables for the processes started inside (a spawned process copies this one's)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _collect(procs: list[Any], pipes: list[Any], start: Any) -> list[dict[str, Any] | None]:
    """Each run's row as its process sends it, or None for one that ended without (one thread waits on every
    pipe). Once a run's process is done, no other run waits for it at the start barrier (aborting a barrier
    that every run has passed changes nothing)."""
    from multiprocessing.connection import wait

    rows: list[dict[str, Any] | None] = [None] * len(pipes)
    waiting = {id(pipe): i for i, pipe in enumerate(pipes)}
    while waiting:
        for pipe in wait([pipes[i] for i in waiting.values()]):
            i = waiting.pop(id(pipe))
            try:
                rows[i] = pipe.recv()
            except EOFError:
                pass
            pipe.close()
            procs[i].join()
            start.abort()
    return rows


def _end(procs: list[Any]) -> None:
    """Wait for the runs' processes to end (an interrupted one finishes its step first), then stop those
    that did not."""
    for proc in procs:
        proc.join(END_GRACE_S)
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def run_process(job: Any, seed: int, lr: float | None, address: str, start: Any, send: Any) -> None:
    """A run's process (module doc): trains the run of (`seed`, `lr`) on the worker at `address`, sends its row."""
    from groupwise.jobs.train_setup import show_progress

    show_progress()
    try:
        row = asyncio.run(_run(job, seed, lr, address, start))
    except KeyboardInterrupt:  # the sweep's process was interrupted too: it reports what the runs kept
        return
    send.send(row)
    send.close()


async def _run(job: Any, seed: int, lr: float | None, address: str, start: Any) -> dict[str, Any]:
    import groupwise as gw
    from groupwise.envs import get_env
    from groupwise.jobs.train_setup import job_backend, new_model, peak_rss_gb, prepare, run_row
    from groupwise.loop.lockstep import takes_part

    spec, preset = get_env(job.env), job.preset(lr)
    model = new_model(job, spec, seed, lr)
    backend = job_backend(job, preset, join=address)
    sft_steps, result = 0, None
    try:
        try:
            t0 = time.monotonic()
            plan, sft_steps = await prepare(job, spec, model, seed, preset, backend)
            print(f"[groupwise train] [{model.name}] {'loaded and warm-started' if sft_steps else 'loaded'} in "
                  f"{time.monotonic() - t0:.1f}s; its folder {model.run_dir}", flush=True)
            if takes_part(plan.config):  # every run's first step waits for the others (module doc)
                await backend.lockstep_member(model).expect()
        except Exception as exc:  # this run ends alone; the others still meet at the start
            result = exc
        await asyncio.to_thread(_meet, start)
        if result is None:
            [result] = await gw.fit_runs([plan])
    finally:
        await backend.close()
    row = run_row(model, seed, preset, sft_steps, result, spec.val_metric or "reward")
    row["_peak_gb"] = peak_rss_gb()  # this process's own: the job's sums every process's (`sweep`)
    return row


def _meet(start: Any) -> None:
    try:
        start.wait()
    except threading.BrokenBarrierError:  # a run's process ended before the start: go on without it
        pass
