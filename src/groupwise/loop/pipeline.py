"""The asynchronous loop (`LoopConfig.max_steps_off_policy` = d >= 1): rollouts for later steps are
gathered while a step trains.

Schedule. The batch of step j is gathered from the policy of step v(j) = max(0, j - d) (the adapter
served as ``name@v``), and its gathering starts as soon as that policy is served. While step k trains,
the batches of steps k+1 .. k+d are being gathered (from the policies k+1-d .. k), so the long tail of
a batch's rollouts (slow tool calls, a judge call per group) has d training steps to finish before the
trainer needs it; the trainer waits only for what the pipeline could not hide (``time/wait_s``).

Why a fixed schedule rather than "whichever policy is newest when a rollout starts" (ART's
PipelineTrainer): the policy of each batch is a function of the step, not of timing. A run is then
reproducible like a synchronous one (with seeded rollouts and the batch-invariant engine, bitwise in one
process: LoopConfig.seed_rollouts says what holds across processes), and a
run resumed after kill -9 gathers again exactly the batches an uninterrupted run had in flight: the
policies they need are held by the backend (`Backend.hold_steps`: retention keeps their checkpoints and
keeps serving them) until no batch samples them any more.

Partial rollouts (`LoopConfig.partial_rollouts`): rollouts ask for the latest policy instead of
``name@v``, and a sequence being sampled continues under each newer adapter as the trainer publishes it
(`Engine.retarget`): fresher tokens, but which version sampled which token depends on timing.

Admission. The staleness of a token is the training step minus the policy version that sampled it, read
from the token's provenance (`Trajectory.policy_versions`; the scheduled version for a server that does
not report it). A group with a token more than d versions old is late: it is left out of the batch,
counted (``pipeline/late_groups``) and recorded as a ``late_groups`` alert, never silently dropped; a batch
whose groups are all late is gathered again from the latest policy, logged as that policy and admitted
by the same rule (a run whose batch is all late twice stops, naming why). With the fixed schedule this
never happens unless a rollout asks another model than the one it is handed. Batches gathered ahead of a stop
are recorded too (a ``pipeline_abandoned`` alert).

Correcting for staleness is the loss's job: `TrainConfig(off_policy="tis")` weighs each token by the
ratio between the trainer's policy and the one that sampled it (training/loss.py).

Logged in each step's loop row: ``pipeline/policy`` (v of the batch), ``pipeline/staleness_mean`` and
``pipeline/staleness_max`` (over the batch's tokens), ``pipeline/late_groups``, ``time/wait_s``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from groupwise.errors import NotTrainableError
from groupwise.loop.cursor import DataCursor, batches
from groupwise.loop.detectors import Alert
from groupwise.loop.stopping import StopDecision
from groupwise.core.trajectory import TrajectoryGroup

log = logging.getLogger("groupwise.loop")

__all__ = ["Gathered", "Pipeline", "hold_for_resume", "run_pipelined", "staleness"]


@dataclass
class Gathered:
    """One gathering of a step's batch, scored: the groups and what it cost. `fields` go into the step's
    loop row (here: the staleness and the trainer's waiting time)."""

    groups: list[TrajectoryGroup]
    gather_s: float
    reward_s: float
    fields: dict[str, Any] = field(default_factory=dict)


def staleness(groups: list[TrajectoryGroup], step: int, scheduled: int) -> list[list[int]]:
    """Per group, the staleness of every sampled token trained at `step` (`step - version`); a
    trajectory whose server reported no versions counts once, at the `scheduled` policy."""
    out = []
    for g in groups:
        ages = []
        for t in g.trajectories:
            versions = t.policy_versions() or [scheduled]
            ages.extend(step - v for v in versions)
        out.append(ages)
    return out


class Pipeline:
    """The batches being gathered ahead of the trainer, by step, and the admission rule."""

    def __init__(self, loop: Any, step: int) -> None:  # loop: fit.Loop (which imports this module)
        self.loop, self.d = loop, loop.c.max_steps_off_policy
        self.tasks: dict[int, asyncio.Task] = {}
        self.scheduled: dict[int, int] = {}  # step -> the policy version its batch is gathered from
        self.step = step  # completed training steps: the newest policy served

    def policy_for(self, step: int) -> int:
        return max(0, step - self.d)

    def model_for(self, version: int) -> Any:
        """What the batch's rollouts are handed: ``name@version``, or the model itself (its latest
        policy, followed mid-sequence) with partial rollouts."""
        return self.loop.model if self.loop.c.partial_rollouts else self.loop.at_step(version)

    async def hold(self, upcoming: list[int]) -> None:
        """Tell the backend which policies the gathered-ahead batches (and a resume of them) sample."""
        await self.loop.model.backend.hold_steps(self.loop.model, sorted({self.policy_for(s) for s in upcoming}))

    async def start(self, step: int, indices: list[int]) -> None:
        """Start gathering the batch of `step` from its scheduled policy (which must be served)."""
        version = self.policy_for(step)
        await self.loop.ensure_served(version)
        self.scheduled[step] = version
        self.tasks[step] = asyncio.create_task(self.loop.gather_scored(self.model_for(version), step, indices, 0))

    async def gathered(self, step: int, indices: list[int], attempt: int) -> Gathered:
        """The batch of `step` for `Loop.step`: the gathered-ahead one, admitted; a resampled attempt
        is gathered from the same scheduled policy (seeded anew), now."""
        version = self.scheduled.get(step, self.policy_for(step))
        if attempt > 0 or step not in self.tasks:
            got = await self.loop.gather_scored(self.model_for(version), step, indices, attempt)
        else:
            t0 = time.perf_counter()
            got = await self.tasks.pop(step)
            got.fields["time/wait_s"] = time.perf_counter() - t0
        ages, late = await self.admit(got, step, version)
        if got.groups == []:  # nothing admissible: gather again, from the latest policy, and admit that too
            version, scheduled = self.step, version
            got = await self.loop.gather_scored(self.model_for(version), step, indices, attempt)
            ages, late_again = await self.admit(got, step, version)
            if got.groups == []:
                raise NotTrainableError(
                    f"step {step}: every group of its batch (policy {scheduled}) and of the batch gathered again "
                    f"from policy {version} (the latest) is late: their tokens were sampled more than "
                    f"max_steps_off_policy={self.d} versions back. The rollouts do not sample the model they are "
                    "handed: pass model.inference_name() (or the model itself) to the client, or raise "
                    "max_steps_off_policy.")
            late += late_again
        flat = [x for a in ages for x in a]
        got.fields.update({
            "pipeline/policy": version, "pipeline/late_groups": late,
            "pipeline/staleness_mean": sum(flat) / len(flat) if flat else 0.0,
            "pipeline/staleness_max": max(flat, default=0),
        })
        return got

    async def admit(self, got: Gathered, step: int, version: int) -> tuple[list[list[int]], int]:
        """Leave out (and record) the groups of `got` holding a token more than d versions old at `step`,
        `version` being the policy the batch was gathered from; (the admitted groups' staleness, how many
        groups were late). `got.groups` is left empty when none is admissible."""
        ages = staleness(got.groups, step, version)
        late = [i for i, a in enumerate(ages) if a and max(a) > self.d]
        if late:
            await self.record_late(step, got.groups, late, ages)
            keep = [i for i in range(len(got.groups)) if i not in late]
            got.groups, ages = [got.groups[i] for i in keep], [ages[i] for i in keep]
        return ages, len(late)

    async def record_late(self, step: int, groups: list[TrajectoryGroup], late: list[int], ages: list[list[int]]) -> None:
        message = (f"{len(late)} of {len(groups)} groups of step {step} hold tokens more than "
                   f"max_steps_off_policy={self.d} policy versions old (oldest {max(max(ages[i]) for i in late)} "
                   "behind): left out of the batch. Their rollouts asked for another policy than the one they "
                   "were handed (model.inference_name()), or the server reports no provenance.")
        alert = Alert("late_groups", "warning", step, message,
                      {"groups": [groups[i].metadata.get("scenario_index") for i in late],
                       "staleness_max": [max(ages[i]) for i in late]})
        await self.loop.history.write(alert.to_row("drop"))
        self.loop.alerts.append(alert)
        log.warning("step %d: %s", step, message)

    async def abandon(self, step: int, *, record: bool) -> None:
        """Cancel the batches gathered ahead of a stop (and record which, when `record`)."""
        pending = sorted(self.tasks)
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.tasks.clear()
        if pending and record:
            alert = Alert("pipeline_abandoned", "info", step,
                          f"the run stopped with the batches of steps {pending} gathered ahead; they were not trained",
                          {"steps": pending})
            await self.loop.history.write(alert.to_row("ignore"))


async def hold_for_resume(model: Any, step: int, d: int) -> None:
    """Hold the policies that the batches of steps step .. step+d sample from, before anything at
    the start of `fit` runs retention: a resumed run gathers those batches again."""
    await model.backend.hold_steps(model, list(range(max(0, step - d), step + 1)))


async def run_pipelined(loop: Any, cursor: DataCursor, step: int) -> tuple[int, StopDecision | None]:
    """The loop with batches gathered up to `max_steps_off_policy` steps ahead; returns (last step,
    stop), the stop None when the data ran out (as `fit.run_steps`)."""
    pipe = Pipeline(loop, step)
    if loop.c.train_config is None or loop.c.train_config.off_policy == "none":
        log.info("max_steps_off_policy=%d without an off-policy correction: the loss takes each token's sampler "
                 "as PPO's old policy; TrainConfig(off_policy='tis') corrects for the staleness", pipe.d)
    upcoming = batches(cursor, loop.c.groups_per_step, loop.c.num_epochs)
    ahead: deque[tuple[int, list[int], DataCursor]] = deque()  # (step, indices, cursor after) not trained yet
    max_steps = loop.c.max_steps
    start, t_steps, decision = step, time.perf_counter(), None

    async def fill() -> None:
        # Read the batches whose policy is served, and start gathering those not started yet.
        while len(ahead) <= pipe.d and (max_steps is None or step + len(ahead) < max_steps):
            nxt = next(upcoming, None)
            if nxt is None:
                break
            ahead.append((step + len(ahead), *nxt))
        await pipe.hold([s for s, _, _ in ahead])
        for s, indices, _ in ahead:
            if s not in pipe.tasks and s not in pipe.scheduled and pipe.policy_for(s) <= pipe.step:
                await pipe.start(s, indices)

    try:
        await fill()
        while ahead:
            s, indices, after = ahead.popleft()
            step, groups, judged, solved = await loop.step(s, indices, after, source=pipe.gathered)
            pipe.step = step
            await fill()
            decision = solved or await loop.decide(step, groups, judged)
            loop.log_progress(step, start, time.perf_counter() - t_steps)
            if decision:
                break
    except BaseException:
        # A failed run records nothing more (as after kill -9): its resume gathers these batches again.
        await pipe.abandon(step, record=False)
        raise
    await pipe.abandon(step, record=True)
    return step, decision
