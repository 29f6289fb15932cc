"""`Publications`: what a rank does with a run's adapter after its step's updates, and with its old
checkpoints.

A trainer rank keeps a copy of the adapter taken right after the update (`keep`, on the update's own
thread, so the next run's update does not run beside the copy); the publication writes it as the step's
checkpoint on a thread (rank 0), serves the same copy from memory and checks what the engine serves, all
three at once; a rank that only generates serves rank 0's folder instead. Retention then unserves old
steps and deletes checkpoints, whose files are removed off the step's path (`sweep`).

The worker (backend/worker.py) owns one and answers the step protocol's `publish`, `retain` and `prune`
with it; this module holds no model and starts no thread of its own beyond the write's and the sweep's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from groupwise.backend.protocol import PruneCommand, Published, PublishCommand, RetainCommand
from groupwise.backend.replica import Replica
from groupwise.errors import ConfigError
from groupwise.runtime.compute import compute_thread, error_of

__all__ = ["Publications"]

log = logging.getLogger("groupwise.backend")


@dataclass
class Publications:
    """A rank's publications and retention (module doc). `rank`, `trains`, `train_world` are the worker's;
    `verify_adapter` checks what the engine serves after each step; `with_generators`: other ranks serve
    from rank 0's checkpoint, so every rank reports the fingerprint of what it serves."""

    rank: int
    trains: bool
    train_world: int
    verify_adapter: bool
    with_generators: bool
    # run -> (step, the copy its publication writes and serves, seconds it took): taken right after the update
    _kept: dict[str, tuple[int, Any, float]] = field(default_factory=dict, init=False, repr=False)
    # run -> the removal of the checkpoints its retention deleted
    _sweeps: dict[str, asyncio.Future] = field(default_factory=dict, init=False, repr=False)

    # ------------------------------------------------------------------------------ the copy
    def copy_for(self, replica: Replica, step: int) -> Callable[[], Any]:
        """What this trainer rank's publication of `step` needs from the trainer, as a call: rank 0 the
        checkpoint's snapshot (it writes and serves it), a rank > 0 the adapter's tensors and config (it
        serves its own copy)."""
        return functools.partial(replica.snapshot, step) if self.rank == 0 else replica.adapter_snapshot

    async def keep(self, run: str, step: int, run_copy: Callable[[Callable[[], Any]], Awaitable[Any]],
                   replica: Replica) -> None:
        """Take `run`'s copy for its publication of `step` now, through `run_copy` (the update's thread).

        Taken at the publication instead, it ran on the compute thread beside the next run's update, and
        each slowed the other (on an H100 a 10-17 ms copy took 30-157 ms beside an update); here it costs
        its own time once, and a lockstep step's four updates took 2.13 s against 2.53 s over three steps
        (docs/benchmarks.md, "Several runs on one GPU"). The trainer holds the same weights until the
        publication: the run's lock keeps its next update out, and no other run's update touches its
        adapter. A copy that fails (a non-finite adapter) is taken again at the publication, which raises
        where a failed publication is handled (the step's checkpoint is then missing)."""
        if not self.trains:
            return
        t0 = time.perf_counter()
        try:
            taken = await run_copy(self.copy_for(replica, step))
        except Exception:  # noqa: BLE001 - raised again by the publication (docstring)
            return
        self._kept[run] = (step, taken, time.perf_counter() - t0)

    def take(self, run: str, step: int) -> tuple[Any, float] | None:
        """(the copy `keep` took for `run`'s publication of `step`, its seconds), once; else None."""
        kept = self._kept.pop(run, None)
        return (kept[1], kept[2]) if kept is not None and kept[0] == step else None

    def drop(self, run: str) -> None:
        """Forget a kept copy: `run`'s update starts again, or the run is unloaded."""
        self._kept.pop(run, None)

    # ------------------------------------------------------------------------------ publishing
    async def publish(self, replica: Replica, checkpoints_dir: str, command: PublishCommand) -> Published:
        """The adapter's publication after the updates of the command's step: rank 0 checkpoints (with
        the step's `history` rows), every rank serves its own copy of the new adapter and checks it.
        Returns the checkpoint path (rank 0), the adapter's fingerprint and that of the served copy (the
        driver compares them); retention is the caller's (`retain`).

        A rank that only generates is called after the trainers, with rank 0's `checkpoint_path`: it
        serves that folder's adapter. A failed check raises before retention: a step whose adapter this
        rank could not serve leaves the steps it served and the checkpoints on disk as they were."""
        step = command.step
        compute = compute_thread()
        times: dict[str, float] = {}  # seconds of each part, for the step's metrics (Published.times)

        @contextlib.contextmanager
        def timed(part: str) -> Iterator[None]:
            t0 = time.perf_counter()
            try:
                yield
            finally:
                times[part] = times.get(part, 0.0) + time.perf_counter() - t0

        if not self.trains:
            if command.checkpoint_path is None:
                raise ConfigError(f"rank {self.rank} only generates: publish it with the trainers' checkpoint_path",
                                  what="publish arguments")
            with timed("serve"):
                await compute.run(replica.serve, step, command.checkpoint_path)
            if self.verify_adapter:
                with timed("check"):
                    replica.check_answers(step)
            return Published(self.rank, served_fingerprint=await compute.run(replica.served_fingerprint, step),
                             times=times)
        writing: asyncio.Future | None = None
        # the copy taken right after the update (`keep`), reported as the publication's first part though
        # its time was the update's; else (a step without an update) taken here
        kept = self.take(command.run, step)
        if kept is not None:
            copy, times["snapshot"] = kept
        else:
            with timed("snapshot"):
                copy = await compute.run(self.copy_for(replica, step))
        if self.rank == 0:
            def write() -> Path:
                with timed("write"):
                    return replica.write(checkpoints_dir, copy, command.metrics, command.cursor, list(command.history))

            # The files are serialised, hashed and written on another thread: meanwhile the compute thread
            # serves and checks the same snapshot, and steps the engine for the other runs' rollouts
            # (compute.py). The publication ends with the write, so a step that returned has its checkpoint
            # on disk, and one whose check fails leaves it there as it would have before.
            writing = asyncio.ensure_future(asyncio.to_thread(write))
            tensors, config = copy.adapter, copy.adapter_config
        else:  # a rank > 0 serves its own copy of the same adapter (the ranks' fingerprints are compared)
            tensors, config = copy
        try:
            # served from the snapshot the checkpoint is written from, without reading the files back
            with timed("serve"):
                await compute.run(replica.serve, step, None, tensors, config)
            if self.verify_adapter:
                with timed("check"):
                    await compute.run(replica.check_adapter, step)
                    replica.check_answers(step)
        except BaseException:  # the check's error is raised, once the write is done (as it was before)
            if writing is not None and (error := await error_of(writing)) is not None:
                log.error("%s: step %d's checkpoint was not written either: %r", command.run, step, error)
            raise
        try:
            path = await writing if writing is not None else None
        except BaseException:
            # served already, but no checkpoint holds it: the run is loaded again from the last one
            await compute.run(replica.unserve, step)
            raise
        return Published(self.rank, checkpoint_path=str(path) if self.rank == 0 else None,
                         # compared between trainer ranks: one rank has nothing to compare with
                         fingerprint=await compute.run(replica.adapter_fingerprint) if self.train_world > 1 else None,
                         # with generators, the driver checks they serve the bits rank 0 serves
                         served_fingerprint=(await compute.run(replica.served_fingerprint, step)
                                             if self.with_generators else None),
                         times=times)

    # ------------------------------------------------------------------------------ retention
    async def retain(self, replica: Replica, checkpoints_dir: str, command: RetainCommand) -> list[int]:
        """Serve only the last `served_steps` steps; unless `best_metric` is None, rank 0 deletes the
        checkpoints that are neither the latest nor the best (`keep` when the caller named it, else the
        best by `best_metric`) nor `in_use` (a KL reference). Returns the deleted steps."""
        from groupwise.training.checkpoint import prune_checkpoints

        c = command
        await compute_thread().run(replica.unserve_before, c.step, c.served_steps, c.in_use)
        if self.rank != 0 or c.best_metric is None:  # None: every checkpoint is kept
            return []
        # Reading the checkpoints' states takes a disk's time: not on the event loop, which serves the other
        # runs' requests meanwhile. The step the caller named (`named_best`) is one of the top: the metric
        # ranks the others. The deleted folders are only renamed here; their files are removed after the
        # publication returns (`sweep`), off the step's path.
        deleted = await asyncio.to_thread(
            prune_checkpoints, checkpoints_dir, best_metric=c.best_metric, maximize=c.maximize,
            metrics_by_step=c.metrics_by_step, keep=c.in_use, named_best=c.keep, keep_recent=c.keep_recent,
            keep_top=c.keep_top, sweep=False)
        if deleted:
            self.sweep(c.run, checkpoints_dir)
        return deleted

    def sweep(self, run: str, checkpoints_dir: str | Path) -> None:
        """Remove the files of the checkpoints `run`'s retention deleted, on a thread, after any earlier
        removal of the same folder; `forget` and `close` wait for it."""
        from groupwise.training.checkpoint import sweep_deleted

        earlier = self._sweeps.get(run)

        async def sweep() -> None:
            if earlier is not None:
                await earlier
            await asyncio.to_thread(sweep_deleted, checkpoints_dir)

        self._sweeps[run] = asyncio.ensure_future(sweep())

    async def prune(self, checkpoints_dir: str, command: PruneCommand) -> list[int]:
        """Rank 0 deletes every checkpoint but the latest, the best by `command.best_metric` and those
        `in_use`; nothing is unserved. Returns the deleted steps."""
        from groupwise.training.checkpoint import prune_checkpoints

        if self.rank != 0:
            return []
        return await asyncio.to_thread(  # off the event loop, as `retain` deletes
            prune_checkpoints, checkpoints_dir, best_metric=command.best_metric,
            metrics_by_step=command.metrics_by_step, keep=command.in_use)

    # ------------------------------------------------------------------------------ ending
    async def forget(self, run: str) -> None:
        """`run` is unloaded: its kept copy is dropped, and its deleted checkpoints' removal awaited."""
        self.drop(run)
        if (sweep := self._sweeps.pop(run, None)) is not None:
            await sweep

    async def close(self) -> None:
        """A deleted checkpoint's files are removed before the process ends."""
        if self._sweeps:
            await asyncio.gather(*self._sweeps.values(), return_exceptions=True)
            self._sweeps.clear()
