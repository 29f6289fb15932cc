"""`get_model_step` at ART's path (``art.utils.get_model_step``): a run's latest checkpointed step read
from its folder, without a backend (`await model.get_step()` asks the backend)."""

from __future__ import annotations

import os
from typing import Any

from groupwise.runs.store import CHECKPOINTS_DIR, checkpoint_folders
from groupwise.runs.output_dirs import get_model_dir

__all__ = ["get_model_step", "get_step_from_dir"]


def get_step_from_dir(output_dir: str) -> int:
    """The largest step with a checkpoint folder under `output_dir` (a run's folder); 0 without any."""
    return max((step for step, _ in checkpoint_folders(os.path.join(output_dir, CHECKPOINTS_DIR))), default=0)


def get_model_step(model: Any, art_path: str | None = None) -> int:
    """`model`'s latest checkpointed step in its run folder (under `art_path`, default its own)."""
    return get_step_from_dir(get_model_dir(model, art_path))
