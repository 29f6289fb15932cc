"""The loop's position in its training data, saved with every checkpoint.

Each epoch visits the scenarios in `epoch_order(n, seed, epoch)` (a pure function, so every process sees
the same order); the cursor says how far into which epoch the loop is. The loop hands the cursor after a
step to `model.train(..., cursor=...)`, the backend saves it in that step's checkpoint, and a restarted
`fit` continues from `backend.checkpoint_cursor(model)`: the same scenarios as an uninterrupted run, also
when `groups_per_step` changed in between (the position counts scenarios, not steps).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from groupwise.errors import ConfigError
from groupwise.core.iterate_dataset import epoch_order

log = logging.getLogger("groupwise.loop")

__all__ = ["DataCursor", "resume_cursor", "batches"]


@dataclass(frozen=True)
class DataCursor:
    """The next scenario to train on is ``epoch_order(num_scenarios, seed, epoch)[offset]``."""

    epoch: int = 0
    offset: int = 0
    seed: int = 0
    num_scenarios: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed, "num_scenarios": self.num_scenarios}

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> "DataCursor | None":
        """The cursor of a checkpoint; None when it holds none (saved by `model.train` without one)."""
        try:
            return cls(int(saved["epoch"]), int(saved["offset"]), int(saved["seed"]), int(saved["num_scenarios"]))
        except (KeyError, TypeError, ValueError):
            return None


def resume_cursor(saved: dict[str, Any], *, step: int, num_scenarios: int, groups_per_step: int, seed: int,
                  sft_steps: int = 0) -> DataCursor:
    """Where a `fit` call starts: the beginning at step 0, else the checkpoint's cursor.

    A checkpoint without a cursor (steps trained by calling `model.train` directly) gets the position
    `step` batches of `groups_per_step` would reach, with a warning; steps that were all supervised
    (`sft_steps` of them: a warm start from demonstrations) used no scenario, so the loop begins at the
    start. A cursor saved for another dataset size or seed cannot be continued and raises."""
    start = DataCursor(0, 0, seed, num_scenarios)
    if step == 0:
        return start
    cursor = DataCursor.from_dict(saved)
    if cursor is None and step <= sft_steps:
        return start
    if cursor is None:
        used = step - sft_steps  # the steps that took scenarios
        per_epoch = math.ceil(num_scenarios / groups_per_step)
        epoch, within = divmod(used, per_epoch)
        log.warning("the checkpoint of step %d holds no data cursor; continuing at the position %d steps of %d "
                    "scenarios reach (epoch %d)", step, used, groups_per_step, epoch)
        return DataCursor(epoch, min(within * groups_per_step, num_scenarios), seed, num_scenarios)
    if (cursor.num_scenarios, cursor.seed) != (num_scenarios, seed):
        raise ConfigError([
            f"the checkpoint of step {step} was trained on {cursor.num_scenarios} scenarios shuffled with seed "
            f"{cursor.seed}; this fit() call has {num_scenarios} with seed {seed}, so its data position cannot be "
            "continued. Pass the same train_scenarios and LoopConfig.seed to resume, or train a new model name."
        ], what="resuming fit()")
    return cursor


def batches(cursor: DataCursor, groups_per_step: int, num_epochs: int) -> Iterator[tuple[list[int], DataCursor]]:
    """(scenario indices of the next step, the cursor after it), until `num_epochs` epochs are used.
    An epoch's last batch may be smaller; batches never span two epochs."""
    n, epoch, offset = cursor.num_scenarios, cursor.epoch, cursor.offset
    while epoch < num_epochs and n > 0:
        if offset >= n:
            epoch, offset = epoch + 1, 0
            continue
        chunk = epoch_order(n, cursor.seed, epoch)[offset:offset + groups_per_step]
        offset += len(chunk)
        after = DataCursor(epoch, offset, cursor.seed, n) if offset < n else DataCursor(epoch + 1, 0, cursor.seed, n)
        yield chunk, after
        epoch, offset = after.epoch, after.offset
