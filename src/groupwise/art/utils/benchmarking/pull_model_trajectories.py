"""ART's `pull_model_trajectories`: copy a run's trajectories (and history) back from its backup."""

from __future__ import annotations

import os
from typing import Any

from groupwise.errors import ConfigError
from groupwise.runs.s3 import pull_model_from_s3

__all__ = ["pull_model_trajectories"]


async def pull_model_trajectories(model: Any) -> None:
    """Copy `model`'s run from ``$BACKUP_BUCKET`` (a local folder here, `groupwise.runs.s3`) into its run
    folder, without checkpoints or logs, so `load_trajectories` sees its stored trajectories."""
    bucket = os.environ.get("BACKUP_BUCKET")
    if not bucket:
        raise ConfigError("pull_model_trajectories reads the backup folder from $BACKUP_BUCKET, which is not set",
                          what="trajectory pull")
    print(f"Pulling trajectories for model '{model.name}' from '{bucket}'...", flush=True)
    await pull_model_from_s3(model.storage_name, model.project, s3_bucket=bucket, verbose=True,
                             art_path=str(model.base_path), exclude=["checkpoints", "logs"])
    print("Finished pulling trajectories.", flush=True)
