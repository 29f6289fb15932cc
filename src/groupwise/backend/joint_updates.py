"""Which updates of one base train together, and when (`BackendOptions.joint_updates`).

Runs of one base on one device take turns at the update: one lock per base (backend/worker.py). When
several runs' updates wait for that lock at once (a lockstep sweep's runs end their rollouts together),
training them in one pass (training/joint.py) costs the base's GEMMs and the kernel launches once
instead of once per run, and gives each run the update it would get alone.

How a group forms. Each update that can join (`DeviceWorker._may_join`) queues here and waits for the
lock. The first to get it leads: it takes every queued update with the same shared settings and trains
them together, where packing their micro-batches at least halves them (`JointPlan.worth`: below that
the pass measured slower than the runs in turn); the others find their results ready when the lock
reaches them. Before taking them, the
leader waits a little for the base's other runs, at most half the time per run of the last pass, and
at least `MIN_WAIT_S`: the runs of one step end their rollouts a few tens of milliseconds apart (each
driver tokenises and sends its batch, whatever the model's size), and a partner that comes within that
wait finishes sooner in the pass than after it. A run that was waited for and did not come (it
finished, failed, or runs behind) is not waited for again until its next update arrives, so it costs
at most one wait. The first pass of a base waits for nobody (no time measured yet).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from groupwise.backend.protocol import UpdateCommand
from groupwise.runtime.memory import release_freed_memory
from groupwise.runtime.compute import compute_thread
from groupwise.training.joint import SHARED_SETTINGS, JointPart, joint_plan, joint_train_step
from groupwise.training.lora_forward import JointLayoutError

__all__ = ["MIN_WAIT_S", "JointUpdates"]


def _settings(command: UpdateCommand) -> tuple:
    config = command.updates[0].config
    return tuple(getattr(config, name) for name in SHARED_SETTINGS)


# The shortest wait for a step's other runs: their updates arrive spread by the drivers' own work, not by
# the pass (a small model's pass of a few tens of milliseconds made a wait too short for a loaded host).
MIN_WAIT_S = 0.05


class JointUpdates:
    """The queue of one base's updates that may train together on one worker (module doc)."""

    def __init__(self, worker: Any, base_model: str) -> None:
        self.worker, self.base_model = worker, base_model
        self.pending: list[tuple[UpdateCommand, asyncio.Future]] = []
        self.missed: set[str] = set()  # runs waited for in vain: not waited for until their next update
        self.per_run_s: float | None = None  # the last pass's time per run in it
        self.arrived = asyncio.Event()
        self.passes: collections.Counter[int] = collections.Counter()  # runs in a pass -> passes of that size
        self.refused: str | None = None  # why this base's model cannot join (`JointLayoutError`): all train alone
        self.plan = joint_plan  # a group's pass and whether it is worth it (`JointPlan.worth`, joint.py)

    async def update(self, command: UpdateCommand, lock: asyncio.Lock) -> list[dict[str, float]]:
        """`command`'s metrics, trained alone or in a pass with others (`DeviceWorker.update`)."""
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending.append((command, future))
        self.missed.discard(command.run)
        self.arrived.set()
        try:
            async with lock:
                if not future.done():  # no other leader took it: this one leads
                    group = await self._gather(command)
                    try:
                        if len(group) == 1:
                            t0 = time.monotonic()
                            out = await self.worker.update_alone(command)
                            self.per_run_s = time.monotonic() - t0
                            self.passes[1] += 1
                            return out
                        try:
                            await self._train_together(group)
                        except JointLayoutError as exc:  # this model cannot join: its updates train alone
                            self.refused = str(exc)
                            await self._train_alone(group)
                    except BaseException as exc:  # no run of the group waits on a future nobody will set
                        for _, f in group:
                            if f is not future and not f.done():
                                f.set_exception(exc)
                        raise
        finally:
            self._drop(future)
        return future.result()

    async def _train_alone(self, group: list[tuple[UpdateCommand, asyncio.Future]]) -> None:
        """Each update of `group` by itself, in turn (a pass not worth it, or one that could not start:
        `JointLayoutError`)."""
        self.passes[1] += len(group)
        for command, f in group:
            try:
                f.set_result(await self.worker.update_alone(command))
            except Exception as exc:  # noqa: BLE001 - that run's failure is its own; the others go on
                f.set_exception(exc)

    def _drop(self, future: asyncio.Future) -> None:
        self.pending = [(c, f) for c, f in self.pending if f is not future]

    async def _gather(self, command: UpdateCommand) -> list[tuple[UpdateCommand, asyncio.Future]]:
        """The updates this leader trains (its own first): those queued, after a wait for the base's runs."""
        await asyncio.sleep(0)  # updates sent at the same moment (asyncio.gather) queue before the leader looks
        expected = set(self.worker.runs_of(self.base_model)) - self.missed
        if self.per_run_s is not None:
            deadline = time.monotonic() + max(self.per_run_s / 2, MIN_WAIT_S)
            while not expected <= {c.run for c, _ in self.pending}:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.arrived.clear()
                try:
                    await asyncio.wait_for(self.arrived.wait(), left)
                except TimeoutError:
                    break
        self.missed |= expected - {c.run for c, _ in self.pending}
        mine = _settings(command)
        group = [(c, f) for c, f in self.pending if c is command]
        group += [(c, f) for c, f in self.pending if c is not command and _settings(c) == mine]
        taken = {id(f) for _, f in group}
        self.pending = [(c, f) for c, f in self.pending if id(f) not in taken]
        return group

    async def _train_together(self, group: list[tuple[UpdateCommand, asyncio.Future]]) -> None:
        worker = self.worker
        replicas = [worker.replicas[c.run] for c, _ in group]
        parts = [JointPart(r.trainer, c.updates[0].batch, c.updates[0].config) for r, (c, _) in zip(replicas, group)]
        # planned (each run's micro-batches priced against the free memory) on the thread that steps the engine
        plan = await compute_thread().run(self.plan, parts)
        if not plan.worth:  # too little packs: the runs in turn are faster
            await self._train_alone(group)
            return
        pause = worker.update_pause(replicas[0], [c.updates[0] for c, _ in group])
        t0 = time.monotonic()
        async with pause:
            runs_update, train = worker.update_runner(replicas[0], pause, joint_train_step)
            with worker.update_bar(group[0][0].step) as progress:
                results = await runs_update.run(train, parts, step=[c.step for c, _ in group], plan=plan,
                                                progress=progress)
            for (command, _), result in zip(group, results):  # each publication's copy (`keep_snapshot`)
                if not isinstance(result, BaseException):
                    await worker.keep_snapshot(command.run, pause, command.step + 1)
        self.per_run_s = (time.monotonic() - t0) / len(group)
        self.passes[len(group)] += 1
        for (_, f), result in zip(group, results):
            if isinstance(result, BaseException):
                f.set_exception(result)
            else:
                f.set_result([result])
        del parts, results
        if replicas[0].device.type == "cpu":
            release_freed_memory()  # else RSS grows by GBs a step (memory.py)
