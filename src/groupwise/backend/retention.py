"""Checkpoint retention: which checkpoints a run keeps, and which of its steps the engines go on serving.

What a run keeps (its `CheckpointRetention`, `Backend.set_retention`; the default keeps the latest and
the best):
- the latest checkpoint, always (the run resumes from it), and the `keep_recent` newest;
- the `keep_top` best: the step the caller named (`Backend.keep_best`: a loop that validated it) counts
  as one, the others ranked by the retention's metric, else `BackendOptions.best_checkpoint_metric`
  (``split/key`` read from the run's history; `best_checkpoint_metric` None keeps every checkpoint);
- the steps still in use, whatever the metric says (`in_use`): the KL anchor of the last GRPO step
  (`TrainConfig.kl_reference_step`: a rank loads it before each update) and the steps an asynchronous
  loop still samples from (`Backend.hold_steps`) and the steps a block of code is pinned to
  (`Backend.pin_step`, `TrainableModel.pinned`), which stay served too;
and the engines serve only the last `BackendOptions.served_steps` steps besides those in use. Each prune
is a history row (`prune_row`, split ``retention``): the steps deleted, and why (the rule and what it kept).

It is apart from the driver (backend/driver.py) because it is one decision joined from three sources the
train order does not otherwise meet: the history (the best by a metric), the caller (the named best, the
held steps) and the run's own state (the KL anchor). The driver asks it after every step and on
`keep_best`, `hold_steps` and `delete_checkpoints`, and sends the answer to the workers: after a step
inside the step's publication (`PublishCommand.retain`, backend/protocol.py: each rank applies it once it
serves the new adapter), between steps alone (`Worker.retain`, or `Worker.prune` for `delete_checkpoints`); every rank
unserves, rank 0 deletes. So every worker backend decides alike and a new reason to keep a checkpoint has
one place to go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from groupwise.backend.protocol import PruneCommand, RetainCommand
from groupwise.config import CheckpointRetention

if TYPE_CHECKING:
    from groupwise.backend.options import BackendOptions

RETENTION_SPLIT = "retention"  # the history rows of prunes


class RetainedRun(Protocol):
    """What retention reads of a run (the driver's record of a registered model)."""

    store: Any  # the run store: its history holds the metric by step
    step: int  # the latest checkpoint
    best_step: int | None  # named by keep_best()
    kl_reference_step: int | None  # the KL anchor of the last GRPO step
    held_steps: list[int]  # hold_steps(): an asynchronous loop still samples them
    pinned_steps: list[int]  # pin_step(): a code block samples from them (`TrainableModel.pinned`)
    retention: CheckpointRetention  # set_retention(): the newest k and the top k


def metric_by_step(run: RetainedRun, metric: str, new_rows: Sequence[dict[str, Any]] = ()) -> dict[int, float]:
    """``split/key`` (e.g. "val/reward") read from the history and `new_rows` (a step's rows, not appended
    yet): a val row at step k evaluates checkpoint k. A metric without a split is read from each
    checkpoint's own metrics instead (empty here)."""
    by_step: dict[int, float] = {}
    split, _, key = metric.partition("/")
    if key:
        rows = [*run.store.run_history.rows(split), *(r for r in new_rows if r.get("split") == split)]
        for row in rows:
            if isinstance(row.get(key), (int, float)):
                by_step[int(row["step"])] = float(row[key])
    return by_step


def in_use(run: RetainedRun) -> list[int]:
    """Checkpoints retention must keep whatever the metric says: the KL anchor of the last GRPO step,
    and the steps an asynchronous loop still samples from (`hold_steps`; kept served too)."""
    return [*([run.kl_reference_step] if run.kl_reference_step is not None else []), *run.held_steps,
            *getattr(run, "pinned_steps", ())]


def ranking(run: RetainedRun, options: "BackendOptions") -> tuple[str | None, bool]:
    """(the metric that ranks checkpoints, whether higher is better): the run's retention's, else the
    backend's `best_checkpoint_metric`."""
    policy = getattr(run, "retention", None) or CheckpointRetention()
    if policy.metric is not None:
        return policy.metric, policy.higher_is_better
    return options.best_checkpoint_metric, True


def retain_command(run: RetainedRun, run_key: str, options: "BackendOptions", *, step: int | None = None,
                   new_rows: Sequence[dict[str, Any]] = ()) -> RetainCommand:
    """What every rank applies after a step, `keep_best` or `hold_steps` (`Worker.retain`). The history
    is read only when the metric ranks a checkpoint: none is named, or more than one is kept. A step's
    publication asks before its checkpoint exists: `step` is then the new step, and `new_rows` the history
    rows it appends."""
    policy = getattr(run, "retention", None) or CheckpointRetention()
    metric, maximize = ranking(run, options)
    keep = (run.best_step,) if run.best_step is not None else ()
    ranked = metric is not None and policy.keep_top > len(keep)
    return RetainCommand(run=run_key, step=run.step if step is None else step, served_steps=options.served_steps,
                         best_metric=metric if options.best_checkpoint_metric is not None else None, keep=keep,
                         metrics_by_step=metric_by_step(run, metric, new_rows) if ranked else {}, maximize=maximize,
                         in_use=tuple(in_use(run)), keep_recent=policy.keep_recent, keep_top=policy.keep_top)


def prune_row(command: RetainCommand, deleted: list[int], *, why: str = "") -> dict[str, Any]:
    """The history row of one prune: which checkpoints were deleted after step `command.step`, and why (the
    rule, and the steps it protected: the named best and those in use)."""
    deleted = sorted(int(s) for s in deleted)
    rule = why or (f"not the latest, nor among the {command.keep_recent} newest, nor among the {command.keep_top} "
                   f"best by {command.best_metric} ({'higher' if command.maximize else 'lower'} is better; the named "
                   f"best counts as one), nor in use")
    return {"step": command.step, "split": RETENTION_SPLIT, "name": "prune", "message": f"deleted checkpoints {deleted}: {rule}",
            "deleted": deleted, "keep_recent": command.keep_recent, "keep_top": command.keep_top,
            "metric": command.best_metric, "best": list(command.keep), "in_use": sorted(set(command.in_use))}


def prune_command(run: RetainedRun, run_key: str, best_checkpoint_metric: str) -> PruneCommand:
    """ART's `model.delete_checkpoints()` as the command every rank is sent (`Worker.prune`): every
    checkpoint but the latest, the best by `best_checkpoint_metric` and those in use goes."""
    return PruneCommand(run=run_key, step=run.step, best_metric=best_checkpoint_metric,
                        metrics_by_step=metric_by_step(run, best_checkpoint_metric), in_use=tuple(in_use(run)))
