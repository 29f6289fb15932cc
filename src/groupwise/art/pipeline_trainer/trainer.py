"""ART's `PipelineTrainer`: rollout workers, a trainer and an evaluator that overlap, on groupwise.

What it does (ART's semantics and arguments). `num_rollout_workers` workers each take the next scenario,
wait until the policy is at most `max_steps_off_policy` versions behind the step the trainer is on, and
run ``rollout_fn(model, scenario, config) -> TrajectoryGroup``. Its requests ask for the latest policy
(``model.get_inference_name()``), so a sequence being sampled continues under each newer adapter the
trainer publishes (partial rollouts: `Engine.retarget`). The trainer takes batches of `min_batch_size`
to `max_batch_size` groups as they finish, leaves out stale groups and groups without a learning signal,
and trains; every `eval_every_n_steps` steps ``eval_fn(model, step, config)`` runs beside the pipeline
and its trajectories are logged (a dict of lists: one split each).

Where it differs from ART, on purpose:
- Staleness is read from the tokens: a group is stale when its oldest token (`Trajectory.policy_versions`:
  the adapter step that sampled it) is more than `max_steps_off_policy` versions behind the step being
  trained; ART compares the version current when the rollout started. Trajectories still get ART's
  `initial_policy_version` / `final_policy_version`. Stale and zero-variance groups are logged under the
  split ``discarded`` and counted in a ``pipeline`` row per step (ART logs only the zero-variance ones).
- The update is `model.train`: trajectories stored first, a checkpoint with the scenario offset in its
  data cursor, the new adapter served and verified. Its `TrainConfig` is `learning_rate`, `loss_fn`
  ('cispo' or 'ppo'), `normalize_advantages` (scale_rewards) and, when `max_steps_off_policy` > 0,
  ``off_policy="tis"``: the loss corrects for the staleness the pipeline allows (training/loss.py).
  ART's Tinker options (`loss_fn_config`, `adam_params`, `packed_sequence_length`) are named in a warning.
- Every step is checkpointed (a resume needs it), so `save_checkpoint=False` is named in a warning.
- Resume (`resume=True`) continues at the scenario offset saved with the last step's checkpoint (not in a
  file written beside it, which a kill -9 can leave out of step); scenarios in flight at the crash are
  skipped, as in ART.
- Retention: the backend keeps the latest and the best checkpoint, and this trainer holds the policies
  that rollouts in flight and scheduled evaluations sample from (`Backend.hold_steps`).
  `keep_recent_and_top(recent=, top=, metric=)` is a `gw.CheckpointRetention` the backend applies after
  every step (`Backend.set_retention`), each prune logged in the history (split ``retention``); a
  strategy of the caller's own decides among the others every `checkpoint_retention_interval` steps
  (those it keeps are held too, and so stay served).
- A zero-variance collapse (more than `discard_queue_multiplier` x `min_batch_size` groups without a
  learning signal, ART's failsafe) raises `NotTrainableError` instead of stopping quietly; a group whose
  every rollout raised fails the run, as in ART.
- On one device the engine pauses while the trainer steps (ART asks LocalBackend for dedicated GPUs):
  waiting on tools and judges is overlapped, generation and the update take turns.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from groupwise.config import CheckpointRetention, LoopConfig, TrainConfig
from groupwise.core.validated import field_default, field_help
from groupwise.errors import ConfigError, GroupwiseError, NotTrainableError, warn_ignored
from groupwise.core.learning_signal import tied
from groupwise.art.pipeline_trainer.retention import (
    CHECKPOINT_CREATED_AT_METRIC, CHECKPOINT_EVAL_COMPLETED_METRIC, CHECKPOINT_SAVED_METRIC, CHECKPOINT_SPLIT,
    CheckpointInfo, CheckpointRetentionContext, CheckpointRetentionStrategy,
)
from groupwise.core.trajectory import Trajectory, TrajectoryGroup

log = logging.getLogger("groupwise.art.pipeline_trainer")

__all__ = ["EvalFn", "PipelineTrainer", "RolloutFn", "ScenarioT", "SingleRolloutFn", "make_group_rollout_fn"]

ScenarioT = TypeVar("ScenarioT")
ConfigT = TypeVar("ConfigT")
RolloutFn = Callable[[Any, Any, Any], Awaitable[TrajectoryGroup]]
SingleRolloutFn = Callable[[Any, Any, Any], Awaitable[Trajectory]]
EvalFn = Callable[[Any, int, Any], Awaitable["list[Trajectory | TrajectoryGroup] | dict[str, list[Trajectory | TrajectoryGroup]]"]]
CURSOR_KEY = "pipeline_trainer"  # the trainer's part of each checkpoint's data cursor
LOSSES = ("cispo", "ppo")

# ART's arguments that set a field of groupwise's configs: (the config, its field, why ART's default is kept
# where it differs from the field's, else None). The signature takes the field's default and the constructor's
# doc its help from here, so the two cannot drift (tests/art_compat/test_pipeline_trainer.py checks).
CONFIG_ARGUMENTS: dict[str, tuple[type, str, str | None]] = {
    "learning_rate": (TrainConfig, "learning_rate", None),
    "loss_fn": (TrainConfig, "loss", "ART's PipelineTrainer trains with CISPO unless told otherwise"),
    "normalize_advantages": (TrainConfig, "scale_rewards", None),
    "max_steps_off_policy": (LoopConfig, "max_steps_off_policy",
                             "the pipeline is asynchronous (ART bounds it at 4 versions), where gw.fit is synchronous by default"),
}


def make_group_rollout_fn(single_rollout_fn: SingleRolloutFn, n: int = 4) -> RolloutFn:
    """A group rollout from a single one: `n` concurrent calls; a call that raises is kept in the group
    as its exception."""
    async def group_rollout(model: Any, scenario: Any, config: Any) -> TrajectoryGroup:
        results = await asyncio.gather(*(single_rollout_fn(model, scenario, config) for _ in range(max(n, 0))),
                                       return_exceptions=True)
        return TrajectoryGroup(results)

    return group_rollout


async def _scenarios(items: "AsyncIterator[Any] | Iterable[Any]") -> AsyncIterator[Any]:
    if hasattr(items, "__anext__"):
        async for item in items:  # type: ignore[union-attr]
            yield item
    else:
        for item in items:  # type: ignore[union-attr]
            yield item


class PipelineTrainer(Generic[ScenarioT, ConfigT]):
    """Rollouts, training and evaluation as one asynchronous pipeline (ART's class and arguments; the
    module docstring says how it maps onto groupwise)."""

    def __init__(
        self, model: Any, backend: Any, rollout_fn: RolloutFn, scenarios: "AsyncIterator[Any] | Iterable[Any]",
        config: Any, eval_fn: EvalFn | None = None, *,
        num_rollout_workers: int = 16, min_batch_size: int = 4, max_batch_size: int | None = None,
        max_steps_off_policy: int = 4, queue_maxsize: int | None = None,
        learning_rate: float = field_default(TrainConfig, "learning_rate"), loss_fn: str = "cispo",
        loss_fn_config: dict | None = None, normalize_advantages: bool = field_default(TrainConfig, "scale_rewards"),
        adam_params: object | None = None,
        packed_sequence_length: int | None = None, max_steps: int | None = None,
        discard_queue_multiplier: int = 100, log_interval_seconds: float = 60.0, status_ewa_alpha: float = 0.2,
        total_scenarios: int | None = None, eval_every_n_steps: int = 20, eval_at_start: bool = True,
        save_checkpoint: bool = True, checkpoint_retention_strategy: CheckpointRetentionStrategy | None = None,
        checkpoint_retention_interval: int = 1, resume: bool = True,
    ) -> None:
        p: list[str] = []
        for name, value, low in (("num_rollout_workers", num_rollout_workers, 1), ("min_batch_size", min_batch_size, 1),
                                 ("max_steps_off_policy", max_steps_off_policy, 0),
                                 ("eval_every_n_steps", eval_every_n_steps, 0),
                                 ("discard_queue_multiplier", discard_queue_multiplier, 1),
                                 ("checkpoint_retention_interval", checkpoint_retention_interval, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                p.append(f"{name}={value!r} must be an integer >= {low}")
        for name, value in (("max_batch_size", max_batch_size), ("queue_maxsize", queue_maxsize),
                            ("max_steps", max_steps)):
            low = 0 if name == "max_steps" else 1
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
                p.append(f"{name}={value!r} must be None or an integer >= {low}")
        if isinstance(max_batch_size, int) and isinstance(min_batch_size, int) and max_batch_size < min_batch_size:
            p.append(f"max_batch_size={max_batch_size} must be >= min_batch_size={min_batch_size}")
        if loss_fn not in LOSSES:
            p.append(f"loss_fn={loss_fn!r} must be one of {list(LOSSES)} (groupwise's losses; training/loss.py)")
        if not (isinstance(log_interval_seconds, (int, float)) and log_interval_seconds > 0):
            p.append(f"log_interval_seconds={log_interval_seconds!r} must be > 0")
        if not callable(rollout_fn):
            p.append(f"rollout_fn={rollout_fn!r} must be an async function (model, scenario, config) -> TrajectoryGroup")
        if eval_fn is not None and not callable(eval_fn):
            p.append(f"eval_fn={eval_fn!r} must be an async function (model, step, config) -> trajectories, or None")
        if p:
            raise ConfigError(p, what="PipelineTrainer")
        ignored = [n for n, v in (("loss_fn_config", loss_fn_config), ("adam_params", adam_params),
                                  ("packed_sequence_length", packed_sequence_length)) if v is not None]
        ignored += ["save_checkpoint=False"] if not save_checkpoint else []
        ignored += ["status_ewa_alpha"] if status_ewa_alpha != 0.2 else []
        if ignored:
            warn_ignored("PipelineTrainer", ignored, "every step is checkpointed (resume needs it); Tinker's "
                         "optimizer and packing options have no counterpart here")
        self.model, self.backend, self.rollout_fn, self.config, self.eval_fn = model, backend, rollout_fn, config, eval_fn
        self.num_rollout_workers, self.min_batch_size = num_rollout_workers, min_batch_size
        self.max_batch_size = max_batch_size if max_batch_size is not None else 10 * min_batch_size
        self.max_steps_off_policy, self.max_steps, self.resume = max_steps_off_policy, max_steps, resume
        self.queue_maxsize = queue_maxsize or max(1, max_steps_off_policy * self.max_batch_size)
        self.train_config = TrainConfig(learning_rate=learning_rate, loss=loss_fn, scale_rewards=normalize_advantages,
                                        off_policy="tis" if max_steps_off_policy > 0 else "none")
        self.discard_limit = discard_queue_multiplier * min_batch_size
        self.eval_every_n_steps, self.eval_at_start = eval_every_n_steps, eval_at_start
        self.retention, self.retention_interval = checkpoint_retention_strategy, checkpoint_retention_interval
        self.log_interval_seconds, self.total_scenarios = float(log_interval_seconds), total_scenarios
        self._iterator = _scenarios(scenarios)
        self._next_lock = asyncio.Lock()  # one worker at a time advances the scenario iterator
        self._done = False
        self._leases: Counter[int] = Counter()  # policy version -> rollouts and evaluations sampling it
        self.policy_version = self.next_training_step = 0
        self.scenario_offset = 0
        self.discarded_stale_groups = self.zero_variance_groups = self.failed_rollouts = 0

    # ------------------------------------------------------------------------------ the pipeline
    async def train(self, *, handle_signals: bool = True) -> None:
        """Run the pipeline until `max_steps` steps were trained, the scenarios ran out or a stop was
        requested (`request_stop`, or SIGINT / SIGTERM with `handle_signals`)."""
        start = await self.model.get_step()
        if isinstance(self.retention, CheckpointRetention):  # the backend applies it after every step
            await self.backend.set_retention(self.model, self.retention)
        saved = (await self.backend.checkpoint_cursor(self.model)).get(CURSOR_KEY, {}) if self.resume and start else {}
        for _ in range(int(saved.get("scenario_offset", 0))):  # the scenarios the trained steps used
            if await anext(self._iterator, None) is None:
                break
            self.scenario_offset += 1
        self.policy_version = self.next_training_step = start
        self._cond = asyncio.Condition()
        self._queue: asyncio.Queue[TrajectoryGroup | None] = asyncio.Queue(maxsize=self.queue_maxsize)
        self._workers_left = self.num_rollout_workers
        self._discarded: list[TrajectoryGroup] = []
        self._evals: set[asyncio.Task] = set()
        self._last_eval = start
        loop = asyncio.get_running_loop()
        handled = []
        for sig in (signal.SIGINT, signal.SIGTERM) if handle_signals else ():
            try:
                loop.add_signal_handler(sig, self.request_stop)
                handled.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such support
                pass
        if self.eval_fn is not None and self.eval_at_start:
            self._schedule_eval(start)
        workers = [asyncio.create_task(self._worker(), name=f"rollout worker {i}") for i in range(self.num_rollout_workers)]
        status = asyncio.create_task(self._status_loop(), name="pipeline status")
        try:
            await self._training_stage(start)
        finally:
            self._done = True
            async with self._cond:
                self._cond.notify_all()
            for task in (*workers, status):
                task.cancel()
            await asyncio.gather(*workers, status, return_exceptions=True)
            if self._evals:
                await asyncio.gather(*self._evals, return_exceptions=True)
            for sig in handled:
                loop.remove_signal_handler(sig)

    def request_stop(self) -> None:
        """Stop after the step being trained; rollouts in flight are abandoned."""
        self._done = True
        try:
            self._queue.put_nowait(None)
        except (AttributeError, asyncio.QueueFull):
            pass

    async def _worker(self) -> None:
        while not self._done:
            async with self._next_lock:
                scenario = await anext(self._iterator, None)
                self.scenario_offset += scenario is not None
            if scenario is None:
                break
            async with self._cond:  # at most max_steps_off_policy versions behind the step being trained
                await self._cond.wait_for(lambda: self._done or
                                          self.policy_version >= self.next_training_step - self.max_steps_off_policy)
            if self._done:
                break
            first = self.policy_version
            self._leases[first] += 1
            try:
                group = await self.rollout_fn(self.model, scenario, self.config)
            except Exception as exc:
                self.failed_rollouts += 1
                log.warning("a rollout failed (%s: %s); scenario %d skipped", type(exc).__name__, exc, self.scenario_offset)
                continue
            finally:
                self._leases[first] -= 1
            if not isinstance(group, TrajectoryGroup):
                self.failed_rollouts += 1
                log.warning("rollout_fn returned %s, not a TrajectoryGroup; skipped", type(group).__name__)
                continue
            for t in group.trajectories:
                t.initial_policy_version = first if t.initial_policy_version is None else t.initial_policy_version
                t.final_policy_version = self.policy_version if t.final_policy_version is None else t.final_policy_version
            meta = scenario.get("metadata") if isinstance(scenario, dict) else None
            for key, value in (meta or {}).items():
                if isinstance(key, str) and (value is None or isinstance(value, (str, int, float, bool))):
                    group.metadata[key if key == "scenario_id" else f"scenario_{key}"] = value
            await self._queue.put(group)
        self._workers_left -= 1
        if self._workers_left == 0 and not self._done:
            await self._queue.put(None)  # the scenarios ran out

    async def _training_stage(self, step: int) -> None:
        stop_at = None if self.max_steps is None else step + self.max_steps
        while not self._done and (stop_at is None or step < stop_at):
            t0 = time.perf_counter()
            batch, ended = await self._collect(step)
            waited = time.perf_counter() - t0
            if not batch:
                break
            async with self._cond:  # rollouts for the next steps may start while this one trains
                self.next_training_step = step + 1
                self._cond.notify_all()
            ages = [step - min(_sampled_by(t, step)) for g in batch for t in g.trajectories]
            result = await self.model.train(batch, config=self.train_config,
                                            cursor={CURSOR_KEY: {"scenario_offset": self.scenario_offset}})
            step = int(result.step)
            await self._log_checkpoint_saved(step)
            async with self._cond:
                self.policy_version = self.next_training_step = step
                self._cond.notify_all()
            if self._discarded:
                await self.model.log(self._discarded, split="discarded", step=step - 1)
                self._discarded = []
            await self.model.log(None, split="pipeline", step=step - 1, metrics={
                "discarded_stale_groups": float(self.discarded_stale_groups),
                "zero_variance_groups": float(self.zero_variance_groups),
                "failed_rollouts": float(self.failed_rollouts), "steps_off_policy": sum(ages) / max(len(ages), 1),
                "time/step_trainer_idle_s": waited, "scenario_offset": float(self.scenario_offset)})
            if self.eval_fn is not None and self.eval_every_n_steps and step - self._last_eval >= self.eval_every_n_steps:
                self._schedule_eval(step)
            await self._retain(step)
            if ended:
                break
        if not self._done and stop_at is not None and step < stop_at:
            # the scenarios ran out first: say so, since the program goes on as if max_steps were reached
            log.warning("the scenarios ran out after %d of max_steps=%d steps (%d scenarios; %d groups without "
                        "reward variance, %d stale, %d failed rollouts were left out): give more scenarios, or "
                        "make the reward graded so fewer groups tie", step - (stop_at - self.max_steps),
                        self.max_steps, self.scenario_offset, self.zero_variance_groups,
                        self.discarded_stale_groups, self.failed_rollouts)

    async def _collect(self, step: int) -> tuple[list[TrajectoryGroup], bool]:
        """Between min_batch_size and max_batch_size admitted groups (fewer only when the scenarios end)."""
        batch: list[TrajectoryGroup] = []
        while len(batch) < self.max_batch_size:
            if len(batch) >= self.min_batch_size:
                try:
                    group = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    return batch, False
            else:
                group = await self._queue.get()
            if group is None:
                return batch, True
            if not group.trajectories and group.exceptions:
                first = group.exceptions[0]
                raise GroupwiseError(f"all {len(group.exceptions)} rollouts of a group failed; the first: "
                                     f"{first.type}: {first.message}")
            oldest = min(v for t in group.trajectories for v in _sampled_by(t, step))
            if oldest < step - self.max_steps_off_policy:
                self.discarded_stale_groups += 1
                self._discarded.append(group)
            elif len(group.trajectories) < 2 or tied([t.reward for t in group.trajectories]):
                self.zero_variance_groups += 1
                self._discarded.append(group)
                if self.zero_variance_groups >= self.discard_limit:
                    raise NotTrainableError(
                        f"{self.zero_variance_groups} groups had no reward variance (discard_queue_multiplier x "
                        f"min_batch_size = {self.discard_limit}): the policy may have collapsed. Lower the learning "
                        "rate, make the reward graded, or raise discard_queue_multiplier to go on.")
            else:
                batch.append(group)
        return batch, False

    # ------------------------------------------------------------------------------ evaluation
    def _schedule_eval(self, step: int) -> None:
        self._last_eval = step
        self._leases[step] += 1
        task = asyncio.create_task(self._evaluate(step), name=f"eval step {step}")
        self._evals.add(task)
        task.add_done_callback(self._evals.discard)

    async def _evaluate(self, step: int) -> None:
        t0 = time.perf_counter()
        try:
            result = await self.eval_fn(self.model, step, self.config)  # type: ignore[misc]
            splits = result if isinstance(result, dict) else {"val": result}
            for split, items in splits.items():
                groups = [i for i in items if isinstance(i, TrajectoryGroup)]
                loose = [i for i in items if not isinstance(i, TrajectoryGroup)]
                groups += [TrajectoryGroup(loose)] if loose else []
                if groups:
                    await self.model.log(groups, split=split, step=step, metrics={"time/step_eval_s": time.perf_counter() - t0})
            await self.model.log(None, split=CHECKPOINT_SPLIT, step=step, metrics={_key(CHECKPOINT_EVAL_COMPLETED_METRIC): 1.0})
        except Exception as exc:  # as in ART: a failed evaluation is reported, the training goes on
            log.error("evaluation of step %d failed: %s: %s", step, type(exc).__name__, exc)
        finally:
            self._leases[step] -= 1

    # ------------------------------------------------------------------------------ retention, status
    async def _retain(self, step: int) -> None:
        """Hold the policies that rollouts and evaluations still sample from (and every policy the
        next steps' rollouts may start from), plus those the retention strategy keeps."""
        hold = {v for v, n in self._leases.items() if n > 0}
        hold |= set(range(max(0, step - self.max_steps_off_policy), step + 1))
        if callable(self.retention) and not isinstance(self.retention, CheckpointRetention) and (
                step % self.retention_interval == 0):  # a strategy of the caller's own: what it keeps is held
            eligible = [c for c in self._checkpoints() if c.step not in hold]
            hold |= set(self.retention(CheckpointRetentionContext(current_step=step, checkpoints=eligible)))
        await self.backend.hold_steps(self.model, sorted(hold))

    async def _log_checkpoint_saved(self, step: int) -> None:
        """ART's checkpoint metrics of `step` (``checkpoint/saved``, ``checkpoint/created_at_unix``), in the
        history row of split ``checkpoint``, which `_checkpoints` hands a retention strategy by those names."""
        from groupwise.runs.store import step_dir_name

        path = self.model.store.checkpoints_dir / step_dir_name(step)
        if path.is_dir():
            await self.model.log(None, split=CHECKPOINT_SPLIT, step=step,
                                 metrics={_key(CHECKPOINT_SAVED_METRIC): 1.0,
                                          _key(CHECKPOINT_CREATED_AT_METRIC): path.stat().st_ctime})

    def _checkpoints(self) -> list[CheckpointInfo]:
        from groupwise.runs.store import dir_name_step
        from groupwise.training.checkpoint import read_state

        folder = self.model.store.checkpoints_dir
        metrics: dict[int, dict[str, float]] = {}
        for row in self.model.store.run_history:  # in memory: no reparse of history.jsonl per step
            for key, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                    metrics.setdefault(int(row["step"]), {})[f"{row.get('split')}/{key}"] = float(value)
        out = []
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            step = dir_name_step(path.name)
            if step is not None and read_state(path) is not None:
                m = metrics.get(step, {})
                out.append(CheckpointInfo(step=step, path=str(path), metrics=m,
                                          created_at=datetime.fromtimestamp(path.stat().st_mtime, timezone.utc),
                                          is_eval_step=any(k.startswith(("val/", "test/")) for k in m)))
        return out

    async def _status_loop(self) -> None:
        while not self._done:
            await asyncio.sleep(self.log_interval_seconds)
            of = f"/{self.total_scenarios}" if self.total_scenarios else ""
            log.info("pipeline: policy %d, training step %d, scenarios %d%s, queued groups %d, stale %d, "
                     "zero-variance %d, failed rollouts %d", self.policy_version, self.next_training_step,
                     self.scenario_offset, of, self._queue.qsize(), self.discarded_stale_groups,
                     self.zero_variance_groups, self.failed_rollouts)


def _sampled_by(trajectory: Any, step: int) -> list[int]:
    """The policy versions that sampled `trajectory`'s tokens: their provenance, else its
    initial_policy_version (0, the base, is a version), else `step` (nothing says otherwise)."""
    versions = trajectory.policy_versions()
    if versions:
        return versions
    return [trajectory.initial_policy_version if trajectory.initial_policy_version is not None else step]


def _key(metric: str) -> str:
    """A checkpoint metric's key in its row of split CHECKPOINT_SPLIT (``checkpoint/saved`` -> ``saved``)."""
    return metric.partition("/")[2]


def _arguments_doc() -> str:
    """The constructor's doc: ART's arguments that set a config field, each with that field's help."""
    lines = ["ART's constructor (the class doc says how it maps onto groupwise). The arguments that set a "
             "field of groupwise's configs:", ""]
    for name, (config, field, why) in CONFIG_ARGUMENTS.items():
        kept = f" Its default is ART's, not the field's ({field_default(config, field)!r}): {why}." if why else ""
        lines.append(f"{name}: {config.__name__}.{field}. {field_help(config, field)}{kept}")
    return "\n".join(lines)


PipelineTrainer.__init__.__doc__ = _arguments_doc()
