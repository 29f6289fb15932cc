"""The step protocol between the driver and its workers: typed commands, and the `Worker` protocol.

A train step crosses from the driver (backend/driver.py) to the ranks as two commands, each a frozen
dataclass the driver builds and every rank reads the same way, whichever way it travels (awaited in
process, pickled through a pipe to a worker process, or as a Ray actor call):

1. `UpdateCommand`: the optimizer updates of the step on this rank's share of the batch (one for GRPO, one
   per batch for SFT), each an `Update` of a batch, its settings (`TrainConfig`) and its objective;
2. `PublishCommand`: the adapter's whole publication in one call per rank: rank 0 checkpoints the step
   (with its history row), every rank serves the new adapter and checks it, then applies the step's
   retention (`retain`, a `RetainCommand`: unserve the steps past `served_steps`, rank 0 deletes the
   checkpoints nobody keeps). A rank that only generates is sent it once the trainers answered, with rank
   0's checkpoint (`checkpoint_path`) to serve. Each rank answers `Published`, whose fingerprints the
   driver compares across ranks.

`RetainCommand` also travels alone, when retention changes between steps (`keep_best`, `hold_steps`,
`pin_step`): backend/retention.py decides it either way, so a step and a call between steps keep alike.
`PruneCommand` is ART's on-request pruning (`model.delete_checkpoints()`): rank 0 deletes every checkpoint
but the latest, the best by the metric the caller names and those in use, whatever the retention policy.

`Worker` is the protocol the driver's step is written against: `DeviceWorker` (backend/worker.py) is the
one implementation, placed in the driver's process, in a process per device (backend/processes.py) or as
a Ray actor (backend/ray.py, a subclass). A command names its method (`method`), so the transports stay
generic: they carry a method name and the command, never a dict of loose arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol, runtime_checkable

from groupwise.config import CheckpointRetention

if TYPE_CHECKING:
    from groupwise.config import TrainConfig

__all__ = ["Command", "PruneCommand", "Published", "PublishCommand", "RetainCommand", "Update", "UpdateCommand", "Worker"]


@dataclass(frozen=True)
class Update:
    """One optimizer update: `batch` (a `TokenizedBatch`, this rank's share) under `config`."""

    batch: Any
    config: "TrainConfig"
    objective: Literal["grpo", "sft"] = "grpo"


@dataclass(frozen=True)
class UpdateCommand:
    """The updates of step `step` of run `run` (`RunId.key`), with exclusive use of the shared model.
    Several updates (SFT's batches) are one unit: if one fails, the earlier ones are undone."""

    method: ClassVar[str] = "update"
    run: str
    step: int
    updates: tuple[Update, ...]


@dataclass(frozen=True)
class Published:
    """A rank's answer to `PublishCommand`: rank 0's checkpoint path, the trained adapter's fingerprint
    (None on a generator), with generators the fingerprint of what its engine serves, and the checkpoint
    steps its retention deleted (rank 0; the others delete none). `times`: the seconds of its parts
    (`backend.base.PUBLISH_PARTS`), which the step's metrics report as ``time/publish_<part>_s``."""

    rank: int
    checkpoint_path: str | None = None
    fingerprint: list[int] | None = None
    served_fingerprint: list[int] | None = None
    deleted: tuple[int, ...] = ()
    times: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RetainCommand:
    """Retention after step `step` (backend/retention.py): serve only the last `served_steps` steps (and
    `in_use`); unless `best_metric` is None, rank 0 deletes every checkpoint but the latest, the
    `keep_recent` newest, the `keep_top` best (`keep`, the step the caller named, counts as one; the
    others by `best_metric` over `metrics_by_step`) and `in_use`."""

    method: ClassVar[str] = "retain"
    run: str
    step: int
    served_steps: int
    best_metric: str | None
    keep: tuple[int, ...] = ()
    metrics_by_step: dict[int, float] = field(default_factory=dict)
    maximize: bool = True
    in_use: tuple[int, ...] = ()
    keep_recent: int = CheckpointRetention.keep_recent
    keep_top: int = CheckpointRetention.keep_top


@dataclass(frozen=True)
class PublishCommand:
    """After the updates: checkpoint and serve the adapter of `step` (the new step), check it, then apply
    `retain` (None: retention unchanged). `checkpoint_path` is rank 0's checkpoint, given to the ranks that
    only generate (they serve it; trainers leave it None). A rank whose check fails raises before its
    retention, so a step that failed its check deletes nothing and unserves nothing on that rank."""

    method: ClassVar[str] = "publish"
    run: str
    step: int
    metrics: dict[str, float]
    cursor: dict[str, Any]
    history: tuple[dict[str, Any], ...] = ()
    checkpoint_path: str | None = None
    retain: "RetainCommand | None" = None


@dataclass(frozen=True)
class PruneCommand:
    """`model.delete_checkpoints(best_metric)` on run `run` at its step `step`: rank 0 deletes every
    checkpoint but the latest, the best by `best_metric` over `metrics_by_step` and `in_use` (a KL
    reference, a held or pinned step); no rank unserves anything (served steps stay served from memory)."""

    method: ClassVar[str] = "prune"
    run: str
    step: int
    best_metric: str
    metrics_by_step: dict[int, float] = field(default_factory=dict)
    in_use: tuple[int, ...] = ()


Command = UpdateCommand | PublishCommand | RetainCommand | PruneCommand


@runtime_checkable
class Worker(Protocol):
    """What one rank does for a step (module doc); each call answers for this rank alone."""

    async def update(self, command: UpdateCommand) -> list[dict[str, float]]:
        """Each update's metrics (the loss terms and counts already summed over the trainer ranks)."""
        ...

    async def publish(self, command: PublishCommand) -> Published:
        """Checkpoint (rank 0), serve and check the new adapter, then apply `command.retain`."""
        ...

    async def retain(self, command: RetainCommand) -> list[int]:
        """The checkpoint steps deleted (rank 0; the others delete none)."""
        ...

    async def prune(self, command: PruneCommand) -> list[int]:
        """The checkpoint steps deleted (rank 0; the others delete none)."""
        ...
