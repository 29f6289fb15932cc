"""Checkpoint retention strategies of `PipelineTrainer` (ART's names): a strategy is handed the
checkpoints that may go and returns the steps of those to keep."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from pydantic import BaseModel, Field

from groupwise.backend.base import BEST_CHECKPOINT_METRIC
from groupwise.config import CheckpointRetention
from groupwise.errors import ConfigError

__all__ = ["CHECKPOINT_CREATED_AT_METRIC", "CHECKPOINT_EVAL_COMPLETED_METRIC", "CHECKPOINT_SAVED_METRIC",
           "CheckpointInfo", "CheckpointRetentionContext", "CheckpointRetentionStrategy", "keep_recent_and_top"]

# History metrics of a checkpoint's own rows (ART's names): `PipelineTrainer` writes them in the history
# row of split CHECKPOINT_SPLIT at the checkpoint's step (saved and created_at_unix once the checkpoint
# exists, eval_completed once its evaluation ran), and a strategy finds them in `CheckpointInfo.metrics`.
CHECKPOINT_SPLIT = "checkpoint"
CHECKPOINT_CREATED_AT_METRIC = f"{CHECKPOINT_SPLIT}/created_at_unix"
CHECKPOINT_EVAL_COMPLETED_METRIC = f"{CHECKPOINT_SPLIT}/eval_completed"
CHECKPOINT_SAVED_METRIC = f"{CHECKPOINT_SPLIT}/saved"


class CheckpointInfo(BaseModel):
    """One kept checkpoint: its step, folder, when it was written, and the history metrics of its step."""

    step: int
    path: str
    created_at: datetime
    is_eval_step: bool = False
    metrics: dict[str, float] = Field(default_factory=dict)


class CheckpointRetentionContext(BaseModel):
    """What a strategy decides on: the current step and the checkpoints that may be deleted."""

    current_step: int
    checkpoints: list[CheckpointInfo] = Field(default_factory=list)


CheckpointRetentionStrategy = Callable[[CheckpointRetentionContext], Iterable[int]]


def keep_recent_and_top(*, recent: int = 5, top: int = 2, metric: str = BEST_CHECKPOINT_METRIC) -> CheckpointRetention:
    """Keep the `recent` newest checkpoints and the `top` best by `metric` (a history metric such as
    ``val/reward``, higher is better; ties go to the later step): a `gw.CheckpointRetention`, which
    `PipelineTrainer` hands the backend (each prune logged in the history) and which, called with a
    `CheckpointRetentionContext` as ART's strategies are, returns the steps it keeps."""
    problems = [f"{name}={value!r} must be an integer >= 0" for name, value in (("recent", recent), ("top", top))
                if not isinstance(value, int) or isinstance(value, bool) or value < 0]
    if problems:
        raise ConfigError(problems, what="keep_recent_and_top")
    return CheckpointRetention(keep_recent=recent, keep_top=top, metric=metric)
