"""Checkpoint retention: which checkpoints a run keeps, and which of its steps the engines go on serving.

What a run keeps:
- the latest checkpoint, always (the run resumes from it);
- the best: the step the caller named (`Backend.keep_best`: a loop that validated it), else the best by
  `BackendOptions.best_checkpoint_metric` (``split/key`` read from the run's history; None keeps every
  checkpoint);
- the steps still in use, whatever the metric says (`in_use`): the KL anchor of the last GRPO step
  (`TrainConfig.kl_reference_step`: a rank loads it before each update) and the steps an asynchronous
  loop still samples from (`Backend.hold_steps`) and the steps a block of code is pinned to
  (`Backend.pin_step`, `TrainableModel.pinned`), which stay served too;
and the engines serve only the last `BackendOptions.served_steps` steps besides those in use.

It is apart from the driver (backend/driver.py) because it is one decision joined from three sources the
train order does not otherwise meet: the history (the best by a metric), the caller (the named best, the
held steps) and the run's own state (the KL anchor). The driver asks it after every step and on
`keep_best`, `hold_steps` and `delete_checkpoints`, and sends the answer to the workers: after a step
inside the step's publication (`PublishCommand.retain`, backend/protocol.py: each rank applies it once it
serves the new adapter), between steps alone (`Worker.retain`, or `DeviceWorker.prune`); every rank
unserves, rank 0 deletes. So every worker backend decides alike and a new reason to keep a checkpoint has
one place to go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from groupwise.backend.protocol import RetainCommand

if TYPE_CHECKING:
    from groupwise.backend.options import BackendOptions


class RetainedRun(Protocol):
    """What retention reads of a run (the driver's record of a registered model)."""

    store: Any  # the run store: its history holds the metric by step
    step: int  # the latest checkpoint
    best_step: int | None  # named by keep_best()
    kl_reference_step: int | None  # the KL anchor of the last GRPO step
    held_steps: list[int]  # hold_steps(): an asynchronous loop still samples them
    pinned_steps: list[int]  # pin_step(): a code block samples from them (`TrainableModel.pinned`)


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


def retain_command(run: RetainedRun, run_key: str, options: "BackendOptions", *, step: int | None = None,
                   new_rows: Sequence[dict[str, Any]] = ()) -> RetainCommand:
    """What every rank applies after a step, `keep_best` or `hold_steps` (`Worker.retain`): a step named
    by `keep_best` is the best, so the history is read only when none is named. A step's publication asks
    before its checkpoint exists: `step` is then the new step, and `new_rows` the history rows it appends."""
    metric = options.best_checkpoint_metric
    by_step = metric_by_step(run, metric, new_rows) if run.best_step is None and metric is not None else {}
    keep = (run.best_step,) if run.best_step is not None else ()
    return RetainCommand(run=run_key, step=run.step if step is None else step, served_steps=options.served_steps,
                         best_metric=metric, keep=keep, metrics_by_step=by_step, maximize=True,
                         in_use=tuple(in_use(run)))


def prune_args(run: RetainedRun, best_checkpoint_metric: str) -> dict[str, Any]:
    """The arguments of `DeviceWorker.prune` for ART's `model.delete_checkpoints()`: every checkpoint but the
    latest, the best by `best_checkpoint_metric` and those in use goes."""
    return {"best_metric": best_checkpoint_metric, "metrics_by_step": metric_by_step(run, best_checkpoint_metric),
            "keep": in_use(run)}
