"""`RunId`: the one identity of a training run, from the model to the served adapter.

A run is its folder in a run store: ``<root>/<project>/models/<run>``, ART's layout (``run`` is the model's `storage_name`:
its ``run_name``, else its ``name``). Everything a backend keeps for a run is keyed by that identity:
the driver's run, its writer lock, the workers' replicas, the names its adapters are served under, its
history and the dashboard's run id (``<project>/<run>``, relative to the store the dashboard reads).
Keyed by the bare model name instead, two `TrainableModel`s named ``agent`` in two projects, registered
on one backend, would be one run: the second would train the first's adapter and write into its store.

Served names: a request may ask for a run by its model name (``agent``, ``agent@3``), as ART's clients
do, while no other run on the backend has that name; the qualified name (``<project>/<run>``, e.g.
``2048/agent@3``) always works, and a bare name two runs share is refused naming both (never a guess).
`model.inference_name()` returns the bare name while it is unambiguous, else the qualified one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groupwise.runs.store import MODELS_DIR

__all__ = ["RunId"]


@dataclass(frozen=True)
class RunId:
    """Which run: the run store's root (absolute), the project, and the run's folder name."""

    root: str
    project: str
    run: str

    @classmethod
    def of(cls, model: Any) -> "RunId":
        """The run `model` (a `Model` or `TrainableModel`) writes: its base_path, project and storage_name."""
        return cls(os.path.abspath(str(model.base_path)), str(model.project), str(model.storage_name))

    @property
    def key(self) -> str:
        """``<project>/<run>``: the run's name inside one backend (its workers, its served names) and
        within one store (the dashboard's run id). Two runs of one backend never share it (`register`
        refuses a second store's run of the same project and name)."""
        return f"{self.project}/{self.run}"

    @property
    def folder(self) -> Path:
        """Where the run store keeps the run (`store.run_dir_of` names the same folder, and moves a run of
        the earlier layout there when it is opened)."""
        return Path(self.root) / self.project / MODELS_DIR / self.run

    def __str__(self) -> str:
        return str(self.folder)
