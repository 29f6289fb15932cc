"""ART's `art.utils.s3_checkpoint_utils`: which checkpoint steps a run's backup holds, without copying
them. The backup is a local folder here (`groupwise.runs.s3`), ``<bucket>/[prefix/]<project>/models/<name>``."""

from __future__ import annotations

from groupwise.runs.store import checkpoint_folders
from groupwise.runs.s3 import mirror_dir

__all__ = ["get_checkpoint_step_not_after_from_s3", "get_latest_checkpoint_step_from_s3"]


def _steps(model_name: str, project: str, s3_bucket: str | None, prefix: str | None) -> list[int]:
    return [step for step, _ in checkpoint_folders(mirror_dir(s3_bucket, prefix, project, model_name) / "checkpoints")]


async def get_latest_checkpoint_step_from_s3(model_name: str, project: str, s3_bucket: str | None = None,
                                             prefix: str | None = None) -> int | None:
    """The newest checkpoint step of the run's backup, or None when it has none (as ART's)."""
    steps = _steps(model_name, project, s3_bucket, prefix)
    return steps[-1] if steps else None


async def get_checkpoint_step_not_after_from_s3(model_name: str, project: str, not_after_step: int,
                                                s3_bucket: str | None = None, prefix: str | None = None) -> int | None:
    """The newest checkpoint step of the backup at or before `not_after_step`, or None."""
    steps = [s for s in _steps(model_name, project, s3_bucket, prefix) if s <= not_after_step]
    return steps[-1] if steps else None
