"""`gw.fit`: the training loop (gather, score, train, validate, stop) as one library call.

One step::

    batch of scenarios (loop/cursor.py, resumable) ─► gather groups of rollouts ─► score_group
    (optional, e.g. RULER) ─► model.train (GRPO step; logs the train row of the policy that sampled) ─► every
    `eval_every` steps: validation rollouts at the new step, scored by `validate` against ground
    truth, logged as the val row ─► detectors ─► policy + stopping rules ─► next step or stop.

At the start the untrained base (``name@0``) and every baseline model are scored once on the validation
split; at the end the step the run stopped on is validated if it was not, and the best checkpoint (by
the validation metric) is evaluated once on the test split
(requests to ``name@<best step>``). Everything the loop decides (alerts, baselines, the stop) is
appended to the run's history (rows of splits ``alert``, ``baseline``, ``loop``, ``stop``; see
`groupwise.runs.series`), so `groupwise report` can draw it and a resumed run can read it.

A step whose groups all tie (no learning signal) is gathered again, same scenarios, up to
`resample_no_signal` times, each recorded as a ``no_signal`` alert; the rule is
`groupwise.core.learning_signal`'s. If the last gathering still ties at the top (every rollout scored the
run's highest reward, or the `validate` metric is at its ceiling) the task is solved: the run stops, rule
``converged``, with its summary and best checkpoint. Otherwise the backend skips the step as ART does
(`TrainConfig.max_skipped_steps`): no gradient step, the step counter and the data position both
advance by one (they stay in lockstep, so resume is unchanged), and too many skipped steps in a row
raise NotTrainableError: a run that cannot learn fails loudly.

The loop speaks to the backend only through the public `Backend` methods: after every validation it
names the best checkpoint so far (`keep_best`, so retention keeps it), and for the test it serves
``name@<best step>`` again (`serve_step`).

Resume: each step hands its data position (`groupwise.loop.cursor`) to `model.train`, which saves it
with the step's checkpoint; the backend's step counts completed steps. Calling `fit` again after a
crash continues at the step that did not complete, with the scenarios an uninterrupted run would have
used (`backend.checkpoint_cursor`). A validation missing at a resumed step (the crash came between the
train step and its validation) is run first.

Reproducible rollouts: each training rollout gets its scenario seeded from (seed, step, scenario,
rollout) where the scenario has a free ``sampling_seed`` (`groupwise.loop.rollout_inputs` says how far
that goes).
"""

from __future__ import annotations

import asyncio
import logging
import math
import dataclasses
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from groupwise.backend.base import PUBLISH_PARTS
from groupwise.config import CheckpointRetention, LoopConfig, TrainConfig
from groupwise.errors import ConfigError, NotTrainableError
from groupwise.core.learning_signal import assess, loop_action
from groupwise.loop.cursor import DataCursor, batches, resume_cursor
from groupwise.loop.audit import audit_before_training
from groupwise.loop.checks import before_training, check_fit_args, maybe_await, takes_scenario
from groupwise.loop.detectors import (Alert, reference, reference_of, rollout_detectors, rollout_signals,
                                      validation_detectors)
from groupwise.runs.step_summary import answer_text
from groupwise.loop.intervals import mean_interval
from groupwise.loop import lockstep
from groupwise.loop.pipeline import Gathered, hold_for_resume, run_pipelined
from groupwise.loop.policy import (PolicyDecision, action_for, classify, decide, pending_stop, stop_now,
                                   stop_reason_once)
from groupwise.loop.progress import eta_seconds, step_line
from groupwise.loop.rollout_inputs import AtStep, seeded_scenario
from groupwise.runs.series import rows, series
from groupwise.rollout.hangs import HangReport, HangWatch
from groupwise.loop.stopping import StopDecision, baseline_values, check_stopping, reward_range_of, val_at_ceiling
from groupwise.core.trajectory import Trajectory, TrajectoryGroup
from groupwise.core.validated import replace_set

log = logging.getLogger("groupwise.loop")

Rollout = Callable[[Any, Any], Awaitable[Trajectory]]
ScoreGroup = Callable[[TrajectoryGroup], "TrajectoryGroup | None | Awaitable[TrajectoryGroup | None]"]
Validate = Callable[..., "float | Awaitable[float]"]


@dataclass
class FitSummary:
    """What `fit` did and why it stopped."""

    run_dir: str
    stop: StopDecision
    start_step: int  # the step this call started at (> 0 when it resumed)
    final_step: int  # completed training steps when it stopped
    metric: str  # "val/<metric>", or "train/reward" without validation
    best_step: int | None = None
    best_value: float | None = None
    baselines: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] | None = None
    alerts: list[Alert] = field(default_factory=list)
    status: str = "unknown"  # the "when metrics diverge" row: healthy, converged, hacking, unstable, unknown

    @property
    def stop_reason(self) -> str:
        return self.stop.reason

    def __str__(self) -> str:
        lines = [
            f"run {self.run_dir}: steps {self.start_step} -> {self.final_step}",
            f"stopped ({self.stop.rule}): {self.stop.reason}",
            f"best {self.metric}: {self.best_value if self.best_value is None else f'{self.best_value:.4g}'} "
            f"at step {self.best_step} (status: {self.status})",
        ]
        for name, v in self.baselines.items():
            lines.append(f"baseline {name}: {v:.4g}")
        if self.test:
            lines.append("test (best checkpoint): " + ", ".join(f"{k}={v:.4g}" for k, v in self.test.items()))
        for a in self.alerts:
            lines.append(f"alert [{a.severity}] step {a.step} {a.name}: {a.message}")
        return "\n".join(lines)


class Loop:
    """The state of one `fit` call (kept in an object so the steps read as a list of calls).

    `groupwise.loop.baselines.score_baselines` builds one without training data to score baselines."""

    def __init__(self, model, rollout, train, val, test, score_group, validate, baselines, config: LoopConfig):
        self.model, self.rollout, self.score_group, self.validate = model, rollout, score_group, validate
        self.train, self.val, self.test, self.baselines, self.c = train, val, test, baselines, config
        self.store = model.store
        self.history = model.store.run_history  # read here in memory, written once per row (groupwise.runs.history)
        self.alerts: list[Alert] = []
        self.dropped_groups = 0  # groups score_group dropped (counted per step in the loop row)
        # per check (rollouts, validation): names of the alerts that check raised at the previous step
        self._firing: dict[bool, set[str]] = {True: set(), False: set()}
        self.reward_range: tuple[float, float] | None = None  # lowest, highest train reward of the run so far

    # -- gathering ---------------------------------------------------------------------------------
    async def gather(self, model: Any, scenarios: Sequence[Any], indices: Sequence[int], n: int, desc: str,
                     step: int | None = None, attempt: int = 0) -> list[TrajectoryGroup]:
        from groupwise.rollout.gather import gather_trajectory_groups

        def scenario(i: int, j: int) -> Any:
            if step is None or not self.c.seed_rollouts:
                return scenarios[i]
            return seeded_scenario(scenarios[i], self.c.seed, step, i, j, attempt)

        groups = [
            TrajectoryGroup((self.rollout(model, scenario(i, j)) for j in range(n)), metadata={"scenario_index": i})
            for i in indices
        ]
        return await gather_trajectory_groups(groups, pbar_desc=desc, max_exceptions=self.c.max_exceptions,
                                              rollout_timeout_s=self.c.rollout_timeout_s,
                                              hang_after_s=self.c.hang_after_s, on_hang=self.on_hang(step, desc))

    def on_hang(self, step: int | None, desc: str) -> Callable[[HangReport], None]:
        """Say a hang report on the loop's logger (the CLI prints it with the step lines) and record it as
        a ``hang`` alert in the history, where the dashboard lists alerts, while the run goes on. Appended at once (a small
        write): the run may be hung for good, and the record is what says where."""
        def record(report: HangReport) -> None:
            log.warning("%s: %s", desc, report.message())
            at = step if step is not None else max((r["step"] for r in self.history.rows("train")), default=0)
            first = report.message().split("\n", 1)[0]
            alert = Alert("hang", "warning", at, f"{desc}: {first}", {**report.evidence(), "phase": desc})
            self.history.append(alert.to_row())
        return record

    async def gather_scored(self, model: Any, step: int, indices: Sequence[int], attempt: int) -> Gathered:
        """The training groups of `step` gathered from `model` and scored (`score_group`)."""
        t0 = time.perf_counter()
        groups = await self.gather(model, self.train, indices, self.c.rollouts_per_group, f"train step {step}",
                                   step=step, attempt=attempt)
        t1 = time.perf_counter()
        groups = await self.score_groups(groups, step, f"judge step {step}")
        return Gathered(groups, t1 - t0, time.perf_counter() - t1)

    async def score_groups(self, groups: list[TrajectoryGroup], step: int | None = None,
                           desc: str = "judge") -> list[TrajectoryGroup]:
        """Run `score_group` on every group concurrently; a None result drops the group. A call without
        progress for `hang_after_s` is named as a hung rollout is (groupwise.rollout.hangs)."""
        if self.score_group is None:
            return groups
        watch = HangWatch(self.c.hang_after_s, self.on_hang(step, desc), then=(
            "The loop does not cancel score_group: a judge's own requests time out (JudgeConfig.timeout_s) "
            "and are retried; a score_group that awaits something else must bound it itself."))

        async def judge(group: TrajectoryGroup) -> Any:
            return await maybe_await(self.score_group(group))  # called in its task: its requests are its progress

        tasks = []
        for k, g in enumerate(groups):
            index = g.metadata.get("scenario_index")
            name = f"score_group on group {k}" + (f" (scenario_index {index})" if index is not None else "")
            tasks.append(watch.create_task(judge(g), watch.activity("judge", name, group=k)))
        try:
            judged = await asyncio.gather(*tasks)
        finally:
            watch.stop()
            for t in tasks:
                t.cancel()  # after a judge's error: the others must not run on unowned
        out = []
        for before, after in zip(groups, judged):
            if after is None:  # e.g. RULER with swallow_exceptions=True after a judge failure
                log.warning("score_group dropped group %s", before.metadata.get("scenario_index"))
                self.dropped_groups += 1
                continue
            if not isinstance(after, TrajectoryGroup):
                raise ConfigError(f"score_group returned {type(after).__name__}; it must return a TrajectoryGroup or None",
                                  what="score_group")
            after.metadata.setdefault("scenario_index", before.metadata.get("scenario_index"))
            out.append(after)
        return out

    async def score(self, groups: list[TrajectoryGroup], scenarios: Sequence[Any]) -> None:
        """Put the validation metric in every trajectory's metrics (the rollout's reward without validate)."""
        takes = self.validate is not None and takes_scenario(self.validate)
        for g in groups:
            scenario = scenarios[int(g.metadata["scenario_index"])]
            for t in g.trajectories:
                if self.validate is None:
                    v = t.reward
                else:
                    v = await maybe_await(self.validate(t, scenario) if takes else self.validate(t))
                v = float(v)
                if not math.isfinite(v):
                    raise ConfigError(f"validate returned {v} for scenario {g.metadata['scenario_index']}; it must be finite",
                                      what="validate")
                t.metrics[self.c.metric] = v

    def interval_fields(self, groups: list[TrajectoryGroup]) -> dict[str, float]:
        """``<metric>_lo``, ``<metric>_hi``, ``<metric>_n`` of scored groups: the confidence interval that
        tells the detectors how noisy this measurement is (`groupwise.loop.intervals`)."""
        m = self.c.metric
        # a rollout's nan or inf has no place in an interval (and none in the history: store.py's schema)
        ci = mean_interval([[t.metrics[m] for t in g.trajectories if m in t.metrics and math.isfinite(t.metrics[m])]
                            for g in groups], self.c.confidence)
        return {} if ci is None else {f"{m}_lo": ci.lo, f"{m}_hi": ci.hi, f"{m}_n": ci.n}

    async def evaluate(self, model: Any, scenarios: Sequence[Any], desc: str) -> tuple[list[TrajectoryGroup], list[TrajectoryGroup]]:
        """(scored groups, judged groups) of one pass over `scenarios`."""
        groups = await self.gather(model, scenarios, range(len(scenarios)), self.c.val_rollouts_per_group, desc)
        await self.score(groups, scenarios)
        judged: list[TrajectoryGroup] = []
        if self.score_group is not None and self.c.judge_val and self.c.val_rollouts_per_group >= 2:
            groups = judged = await self.score_groups(groups, None, f"judge {desc}")
        return groups, judged

    def at_step(self, step: int) -> AtStep:
        return AtStep(self.model, step)

    # -- validation and baselines --------------------------------------------------------------------
    def validated(self, step: int) -> bool:
        return any(r["step"] == step for r in self.history.rows("val"))

    async def validate_at(self, step: int) -> list[TrajectoryGroup]:
        t0 = time.perf_counter()
        model = AtStep(self.model, step)
        groups, judged = await self.evaluate(model, self.val, f"val step {step}")
        await self.model.log(groups, split="val", step=step,
                             metrics={"time/val_s": time.perf_counter() - t0, **self.interval_fields(groups)})
        await self.keep_best(self.best(self.history, step)[1], self.history)  # before retention can drop it
        return judged

    async def ensure_baselines(self) -> None:
        """Score the base (name@0) and each baseline model once; skip those already in the history."""
        have = {r.get("name") for r in self.history.events("baseline")}
        val0 = [r for r in self.history.rows("val") if r["step"] == 0]
        if not val0:
            await self.validate_at(0)
            val0 = [r for r in self.history.rows("val") if r["step"] == 0]
        base = f"{self.model.name}@0"
        if base not in have:
            row = {k: v for k, v in val0[-1].items() if k not in ("split", "recorded_at")}
            await self.history.write({**row, "split": "baseline", "step": 0, "name": base, "kind": "base"})
        for other in self.baselines:
            name = getattr(other, "name", repr(other))
            if name in have:
                continue
            from groupwise.runs.store import history_row

            groups, _ = await self.evaluate(other, self.val, f"baseline {name}")
            safe = "".join(ch if ch.isalnum() or ch in "_.-" else "-" for ch in name)
            await asyncio.to_thread(self.store.write_trajectories, f"baseline-{safe}", 0, groups)
            row = history_row(groups, step=0, split="baseline", metrics=self.interval_fields(groups))
            await self.history.write({**row, "name": name, "kind": "model"})

    # -- one step ------------------------------------------------------------------------------------
    def see_rewards(self, groups: list[TrajectoryGroup]) -> tuple[float, float] | None:
        """Widen the run's reward range (lowest, highest rollout reward so far) by `groups`'s rewards.
        A resumed run starts from its history's train means (`reward_range_of`)."""
        rewards = [r for g in groups for r in g.rewards()]
        if rewards:
            lo, hi = self.reward_range if self.reward_range is not None else (min(rewards), max(rewards))
            self.reward_range = (min(lo, *rewards), max(hi, *rewards))
        return self.reward_range

    async def step(self, step: int, indices: list[int], cursor: DataCursor,
                   source: Callable[[int, list[int], int], Awaitable[Gathered]] | None = None,
                   ) -> tuple[int, list[TrajectoryGroup], list[TrajectoryGroup], StopDecision | None]:
        """Gather, score and train one step: (new step, train groups, judged validation groups, a stop
        when the step showed the task solved). Whether a gathered batch is trained, gathered again or
        ends the run is `groupwise.core.learning_signal`'s rule. `source(step, indices, attempt)` gathers the
        batch (the asynchronous pipeline's, loop/pipeline.py); by default, from the latest policy now."""
        dropped_before = self.dropped_groups
        for attempt in range(self.c.resample_no_signal + 1):
            if source is not None:
                got = await source(step, indices, attempt)
            else:
                got = await self.gather_scored(self.model, step, indices, attempt)
            groups = got.groups
            if not groups:
                raise NotTrainableError(f"step {step}: score_group dropped every group, so there is nothing to train "
                                        "on; check the judge (a judge failing on every group returns None for "
                                        "each with swallow_exceptions=True)")
            for g in groups:
                for t in g.trajectories:
                    t.metrics["answer_chars"] = len(answer_text(t))  # read by the length-drift detector
            # Only a ground-truth metric (validate) has a known ceiling; a reward's maximum is the run's to find.
            ceiling = bool(self.val) and self.validate is not None and val_at_ceiling(self.history, self.c)
            signal = assess([g.rewards() for g in groups], reward_range=self.see_rewards(groups), val_at_ceiling=ceiling)
            # A teacher scores every sampled token, so tied rewards still leave its signal to train on.
            teaching = self.c.step_config().teacher is not None
            action = "train" if teaching else loop_action(signal, attempt, self.c.resample_no_signal)
            if action != "resample":
                break
            # Same step, same scenarios, fresh samples: the data position and step stay in lockstep.
            message = (f"{signal.reason}; sampling the step's scenarios again (attempt {attempt + 2} of "
                       f"{self.c.resample_no_signal + 1}, LoopConfig.resample_no_signal={self.c.resample_no_signal})")
            alert = Alert("no_signal", "warning", step, message,
                          {"attempt": attempt + 1, "kind": signal.kind, "rewards": [g.rewards()[:8] for g in groups[:4]]})
            await self.history.write(alert.to_row("resample"))
            self.alerts.append(alert)
            log.warning("step %d: %s", step, message)
        if action == "converged":
            return step, groups, [], StopDecision(
                True, "converged",
                f"{signal.reason}, in {self.c.resample_no_signal + 1} gathering(s) of step {step}'s scenarios: "
                "nothing is left to learn from this reward",
                step, {"rewards": [g.rewards()[:8] for g in groups[:8]], "reward_range": list(self.reward_range or ())})
        if self.c.score_train and self.validate is not None:
            await self.score(groups, self.train)  # the task metric next to the reward, in the train row too
        signals = self.rollout_signals(step, groups)
        stop = await self.watch_rollouts(step, groups, signals)
        if stop is not None:  # a hack seen in these rollouts: the update that would train on them never runs
            return step, groups, [], stop
        t2 = time.perf_counter()
        result = await self.model.train(groups, config=self.c.step_config(), cursor=cursor.to_dict())
        t3 = time.perf_counter()
        cost = sum(float(g.metrics.get("judge/cost_usd", 0.0)) for g in groups)
        await self.history.write({
            "step": step, "split": "loop", "time/gather_s": got.gather_s, "time/reward_s": got.reward_s,
            "time/train_s": t3 - t2, **train_split(result.metrics), "judge/cost_usd": cost, "scenarios": indices,
            "reward/dropped_groups": self.dropped_groups - dropped_before, **got.fields, **signals,
        })
        new_step = int(result.step)
        judged: list[TrajectoryGroup] = []
        if self.val and new_step % self.c.eval_every == 0:
            judged = await self.validate_at(new_step)
        return new_step, groups, judged, None

    def rollout_signals(self, step: int, groups: list[TrajectoryGroup]) -> dict[str, Any]:
        """The step's rollout signals for the loop row (`groupwise.loop.detectors.rollout_signals`),
        with the base's reference the first time (the run's first step: the base policy sampled it)."""
        d = self.c.detectors
        ref = reference(self.history)
        new_ref = {} if ref is not None else reference_of(groups, step=step, n=d.repetition_ngram,
                                                             collapse_share=d.collapse_share)
        return {**new_ref, **rollout_signals(groups, ref or new_ref, metric=self.c.metric, n=d.repetition_ngram,
                                             collapse_share=d.collapse_share)}

    async def watch_rollouts(self, step: int, groups: list[TrajectoryGroup], signals: dict[str, Any]) -> StopDecision | None:
        """The rollout detectors on the step's scored training rollouts, before the update on them (the
        step's train and loop rows, written after the update, are passed to them ahead): a stop here
        keeps the update from training on what the alert is about."""
        from groupwise.runs.store import history_row

        ahead = [*self.history, history_row(groups, step=step, split="train"), {"step": step, "split": "loop", **signals}]
        decision = await self.raise_alerts(rollout_detectors(ahead, groups, step=step, config=self.c), rollouts=True)
        return stop_now(decision, step) if decision.action == "stop" else None

    async def decide(self, step: int, groups: list[TrajectoryGroup], judged: list[TrajectoryGroup]) -> StopDecision:
        """After the step's validation: the validation detectors, then the stopping rules."""
        alerts = validation_detectors(self.history, step=step, config=self.c, val_groups=judged)
        decision = await self.raise_alerts(alerts, rollouts=False)
        if decision.action == "stop":
            return stop_now(decision, step)
        return pending_stop(self.history, step, self.c) or check_stopping(self.history, step, self.c)

    async def raise_alerts(self, alerts: list[Alert], *, rollouts: bool) -> PolicyDecision:
        """Record the alerts of one check (the rollout detectors', or the validation ones') and say what
        the policy makes of them."""
        decision = decide(alerts, self.c)
        # An alert still firing since the same check of the previous step is recorded again but not printed
        # again: a person watching reads each finding once (its history rows keep every step).
        before, self._firing[rollouts] = self._firing[rollouts], {a.name for a in decision.alerts}
        for a in decision.alerts:
            action = action_for(a, self.c)
            await self.history.write(a.to_row(action))
            self.alerts.append(a)
            if a.name not in before or action == "stop":
                log.warning("step %d: [%s, %s] %s: %s -> %s", a.step, a.severity, a.kind, a.name, a.message, action)
        return decision

    def log_progress(self, step: int, start_step: int, elapsed_s: float) -> None:
        """The step's line (`groupwise.loop.progress`) at INFO: reward, seconds, validation, ETA."""
        if not log.isEnabledFor(logging.INFO):
            return
        history = self.history
        val = rows(history, "val")
        val_s = val[-1].get("time/val_s", 0.0) if val else 0.0
        test_s = (val_s or 0.0) * len(self.test) / max(1, len(self.val)) if self.test else 0.0
        eta = eta_seconds(step=step, start_step=start_step, max_steps=self.c.max_steps, elapsed_s=elapsed_s,
                          test_s=test_s)
        _, best_step, best_value = self.best(history, step) if val else (None, None, None)
        log.info("%s", step_line(history, step, metric=self.c.metric, max_steps=self.c.max_steps, eta_s=eta,
                                 best=(best_step, best_value)))

    # -- the end -------------------------------------------------------------------------------------
    def best(self, history: list[dict], final_step: int) -> tuple[str, int | None, float | None]:
        points = series(history, "val", self.c.metric, up_to=final_step)
        if not points:
            train = series(history, "train", "reward", up_to=final_step)
            return "train/reward", final_step, (train[-1][1] if train else None)
        sign = 1.0 if self.c.higher_is_better else -1.0
        # the latest of equal bests: the same checkpoint LocalBackend's retention keeps
        step, value = max(points, key=lambda p: (sign * p[1], p[0]))
        return f"val/{self.c.metric}", step, value

    async def ensure_served(self, step: int) -> None:
        """Make sure ``name@step`` is served before requests go to it (the best step may be old)."""
        if step != 0:
            await self.model.backend.serve_step(self.model, step)

    async def keep_best(self, best_step: int | None, history: list[dict]) -> None:
        """Tell the backend which checkpoint is best so far, so its retention keeps it (called after
        every validation, at a resume and at the end)."""
        if best_step is not None:
            metrics = {s: v for s, v in series(history, "val", self.c.metric)}
            await self.model.backend.keep_best(self.model, best_step, metrics_by_step=metrics,
                                               maximize=self.c.higher_is_better)

    async def test_at(self, best_step: int) -> dict[str, float]:
        await self.ensure_served(best_step)
        groups, _ = await self.evaluate(AtStep(self.model, best_step), self.test, f"test @{best_step}")
        row = await self.model.log(groups, split="test", step=best_step, metrics=self.interval_fields(groups))
        out = {"reward": math.nan if row["reward"] is None else row["reward"]}  # None: no trajectory finished
        m = self.c.metric
        for key in (m, f"{m}_lo", f"{m}_hi"):
            if isinstance(row.get(key), (int, float)):
                out[key] = row[key]
        return out


async def run_steps(loop: Loop, cursor: DataCursor, step: int) -> tuple[int, StopDecision | None]:
    """The synchronous loop: each step gathers its batch from the latest policy, then trains on it.
    Returns the last step and the stop (None when the data ran out)."""
    start, t_steps = step, time.perf_counter()
    # a sweep's runs start each step's rollouts together (loop/lockstep.py); so do runs of other processes
    # on the worker this run's backend shares with them
    gate = lockstep.current()
    if gate is None and lockstep.takes_part(loop.c):
        member = getattr(loop.model.backend, "lockstep_member", None)  # a duck-typed backend may lack it
        gate = member(loop.model) if member is not None else None
    try:
        for indices, after in batches(cursor, loop.c.groups_per_step, loop.c.num_epochs):
            if gate is not None:
                await gate.arrive()
            step, groups, judged, solved = await loop.step(step, indices, after)
            decision = solved or await loop.decide(step, groups, judged)
            loop.log_progress(step, start, time.perf_counter() - t_steps)
            if decision:
                return step, decision
        return step, None
    finally:
        if gate is not None:  # no other run waits for this one's final test or its failure
            await gate.leave()


TRAIN_SPLIT = {"time/tokenize_s": "time/tokenize_s", "update_time": "time/update_s", "time/publish_s": "time/publish_s",
               # the publication's parts (rank 0's): the checkpoint's copy and its files, serving, the check
               **{f"time/publish_{part}_s": f"time/publish_{part}_s" for part in PUBLISH_PARTS}}


def train_split(metrics: dict[str, float]) -> dict[str, float]:
    """Where a step's ``time/train_s`` went, from the backend's step metrics: tokenising, the update and
    the checkpoint with its publication, and that in its parts (a backend that does not report one leaves
    it out). The rest is
    the wait for the step's trajectories to reach the store and the trip to the ranks."""
    return {field: float(metrics[key]) for key, field in TRAIN_SPLIT.items() if key in metrics}


def with_teacher(config: LoopConfig, teacher: str) -> LoopConfig:
    """`config` whose steps distil toward `teacher` (TrainConfig.teacher owns it); a config naming
    another teacher is a conflict, said rather than overridden."""
    own = config.train_config or TrainConfig()
    if own.teacher is not None and own.teacher != teacher:
        raise ConfigError(f"fit(teacher={teacher!r}) and config.train_config.teacher={own.teacher!r} disagree; "
                          "name the teacher once", what="fit arguments")
    # replace_set: a plain replace would record every field as the caller's, and the one-owner check would
    # then read the train config's default learning rate as a second, disagreeing setting
    return replace_set(config, train_config=replace_set(own, teacher=teacher))


def retention_of(config: LoopConfig, *, validated: bool) -> CheckpointRetention:
    """`config.retention`, its checkpoints ranked by the validation metric unless it names its own (a run
    without validation ranks by the backend's `best_checkpoint_metric`)."""
    policy = config.retention
    if policy.metric is not None or not validated:
        return policy
    return dataclasses.replace(policy, metric=f"val/{config.metric}", higher_is_better=config.higher_is_better)


async def fit(
    model: Any,
    rollout: Rollout,
    train_scenarios: Sequence[Any],
    *,
    val_scenarios: Sequence[Any] | None = None,
    test_scenarios: Sequence[Any] | None = None,
    score_group: ScoreGroup | None = None,
    validate: Validate | None = None,
    baselines: Sequence[Any] = (),
    config: LoopConfig | None = None,
    teacher: str | None = None,
) -> FitSummary:
    """Train `model` with `rollout` on `train_scenarios` until a stopping rule or the policy says stop.

    Args:
        model: a registered `gw.TrainableModel`.
        rollout: ``async rollout(model, scenario) -> Trajectory``; requests ``model.inference_name()``.
        train_scenarios: the training split (80%); batches of `groups_per_step`, shuffled per epoch.
        val_scenarios: the validation split (10%), run every `eval_every` steps and at step 0.
        test_scenarios: the test split (10%), run once on the best checkpoint at the end.
        score_group: applied to every gathered group, ``group -> group | None`` (sync or async), e.g.
            ``lambda g: gw.ruler_score_group(g, "openai/o4-mini")``; None keeps the rollouts' rewards,
            and a None result drops the group. Its ``before_training()``, if any, runs first
            (`gw.JudgeSelection` picks its judge there, or raises `JudgeSelectionError`).
        validate: ``validate(trajectory, scenario) -> float`` (or ``validate(trajectory)``), the
            ground-truth metric (`config.metric`); None uses each validation rollout's own reward.
        baselines: `gw.Model`s (prompted models behind any OpenAI-compatible endpoint) scored once on
            the validation split; they appear in every report and feed the baseline stopping rule.
        config: `gw.LoopConfig`.
        teacher: on-policy distillation toward this teacher: ``"base"`` (the base model), a checkpoint
            folder of an adapter of the same base (e.g. ``<run>/checkpoints/<step>`` of `groupwise train`), or
            another base model of the same tokenizer (a model folder or a Hugging Face id). It sets the step
            config's `TrainConfig.teacher` (its owner; `distill_coef` weighs it there, `distill_estimate`
            chooses the sampled-token or the top-k estimate of its KL).

    Returns a `FitSummary`: stop rule and reason, best step and value, baselines, test result, alerts.
    """
    config = config if config is not None else LoopConfig()
    if teacher is not None:
        config = with_teacher(config, teacher)
    train = list(train_scenarios)
    val = list(val_scenarios or [])
    test = list(test_scenarios or [])
    check_fit_args(rollout, train, val, test, score_group, validate, baselines, config)
    await before_training(score_group)  # e.g. gw.JudgeSelection picks its judge here
    loop = Loop(model, rollout, train, val, test, score_group, validate, list(baselines), config)
    start = step = await model.get_step()
    if config.audit != "off" and step == 0:
        await audit_before_training(model, rollout, train, score_group, validate, config.audit)
    # retention by the run's own policy from the start (a resumed run too: the backend forgets it)
    await model.backend.set_retention(model, retention_of(config, validated=bool(val)))
    if config.max_steps_off_policy > 0:  # first: the keep_best below runs retention
        await hold_for_resume(model, step, config.max_steps_off_policy)
    history = loop.history
    await asyncio.to_thread(len, history)  # the one read of history.jsonl, off the event loop
    loop.reward_range = reward_range_of(history)
    if step > 0 and val:  # a resumed run: retention keeps the best so far, not only the backend's own pick
        await loop.keep_best(loop.best(history, step)[1], history)
    if val:
        await loop.ensure_baselines()
        if step % config.eval_every == 0 and not loop.validated(step):
            await loop.validate_at(step)  # resumed right after a crash between train and validation
    decision = check_stopping(history, step, config) if step > 0 else StopDecision(False)
    if not decision and config.max_steps == 0:
        decision = StopDecision(True, "max_steps", "max_steps=0: nothing to train", 0)
    if not decision:
        cursor = resume_cursor(await model.backend.checkpoint_cursor(model), step=step, num_scenarios=len(train),
                               groups_per_step=config.groups_per_step, seed=config.seed,
                               sft_steps=len(history.rows("sft")))  # rows(): one per step
        if config.max_steps_off_policy > 0:
            step, decision = await run_pipelined(loop, cursor, step)
        else:
            step, decision = await run_steps(loop, cursor, step)
        decision = decision or StopDecision(
            True, "data_exhausted", f"used every training scenario for {config.num_epochs} epoch(s) (step {step})", step)
    if loop.val and step > 0 and not loop.validated(step):
        # a run that stopped between validations (solved, a detector, the data) still offers its last
        # checkpoint: unscored, the best would be an older step, the base itself when none was scored
        await loop.validate_at(step)
    metric, best_step, best_value = loop.best(history, step)
    await history.write({"step": step, "split": "stop", "rule": decision.rule, "reason": decision.reason,
                               "best_step": best_step, "best_metric": metric, "evidence": decision.evidence})
    log.info("stopped at step %d (%s): %s; best %s at step %s", step, decision.rule, stop_reason_once(decision),
             metric, best_step)
    await loop.keep_best(best_step, history)
    test_result = await loop.test_at(best_step) if test and best_step is not None else None
    return FitSummary(
        run_dir=str(loop.store.run_dir), stop=decision, start_step=start, final_step=step, metric=metric,
        best_step=best_step, best_value=best_value, baselines=baseline_values(history, config.metric),
        test=test_result, alerts=loop.alerts, status=classify(history, step, config),
    )
