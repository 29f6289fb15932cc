"""The labelled sets judges are checked on (`groupwise judge eval`, `groupwise train --judge-labels`).

A labelled set is one of:
- an env with a labelled set of its own (``titles``: known-good and known-bad titles), judged with the
  env's rubric;
- a JSONL file (`evaluate.load_labelled`);
- a run folder: its validation trajectories, grouped by scenario across validation steps (answers of
  the same scenario by different checkpoints), labelled by the validation metric stored on each.
"""

from __future__ import annotations

import importlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from groupwise.errors import ConfigError
from groupwise.judge.evaluate import LabelledGroup, labelled_from_groups, load_labelled

__all__ = ["labelled_from_run", "load_labels"]


def _run_metric(run_dir: Path) -> str:
    """The run's validation metric: the key of its val rows that carries an interval (``<key>_lo``)."""
    from groupwise.runs.store import load_history

    for row in reversed(load_history(run_dir, skip_corrupt=True)):
        if row.get("split") == "val":
            keys = [k for k in row if f"{k}_lo" in row]
            if keys:
                return keys[0]
    raise ConfigError(f"{run_dir}: no validation rows with a metric; pass --metric", what="judge eval")


def labelled_from_run(run_dir: str | Path, metric: str | None = None) -> list[LabelledGroup]:
    """A run's validation trajectories, grouped by scenario (their messages up to the first answer)
    across every validation step, labelled by ``metrics[metric]``."""
    from groupwise.runs.store import load_trajectories

    run_dir = Path(run_dir)
    metric = metric or _run_metric(run_dir)
    by_scenario: dict[str, list[Any]] = defaultdict(list)
    for g in load_trajectories(run_dir, "val", skip_corrupt=True):
        for t in g.trajectories:
            msgs = t.messages()
            first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
            by_scenario[json.dumps(msgs[:first], sort_keys=True, default=str)].append(t)
    from groupwise.core.trajectory import TrajectoryGroup

    groups = [TrajectoryGroup(ts, metadata={"scenario": f"val scenario {i}"}) for i, ts in enumerate(by_scenario.values())]
    return labelled_from_groups(groups, metric)


def load_labels(source: str, metric: str | None = None) -> tuple[list[LabelledGroup], str | None]:
    """(labelled groups, the rubric that goes with them or None) from an env name, a JSONL file or a run."""
    path = Path(source)
    if path.is_dir():
        return labelled_from_run(path, metric), None
    if path.is_file():
        return load_labelled(path), None
    if "/" not in source and "." not in source:
        try:
            module = importlib.import_module(f"groupwise.envs.{source}.labelled")
        except ModuleNotFoundError:
            pass
        else:
            return module.labelled_groups(), getattr(importlib.import_module(f"groupwise.envs.{source}"), "RUBRIC", None)
    raise ConfigError(f"--labels {source}: not a JSONL file, a run folder, or an env with a labelled set (titles)",
                      what="judge eval")
