"""`RunView`: one run folder, read. The history, the stored trajectories by split and step, the validation
metric and the steps a reader names (a number, ``best``, ``latest``), answered one way for every reader.

A reader of a run asks the same questions: which rows, which metric, which step is the best, which
trajectories of which step. `groupwise compare` (runs/compare.py) and the judge's labelled sets read from a
run (judge/eval_command.py; tests/layers_check.py keeps the judge off the store's files) ask them here;
`groupwise report`, `inspect` and the dashboard read through the same functions this view stands on
(runs/store.py, runs/series.py, runs/report.py's `val_metric_name`, `resolve_step`), so a run's metric and
its best step are one answer everywhere. A view writes nothing and takes no lock: it reads a run while it
trains.
"""

from __future__ import annotations

import json
from collections import defaultdict
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.errors import ConfigError, StoreError
from groupwise.runs.series import Row, events, rows, value

if TYPE_CHECKING:
    from groupwise.core.trajectory import TrajectoryGroup

__all__ = ["RunView", "resolve_step"]


def resolve_step(spec: str, history: list[Row], val_steps: list[int], metric: str | None = None) -> int:
    """A step number from '12', 'best' or 'latest' (validation steps only): 'best' is the stop row's best
    step, else the best validation of `metric` (the run's, `val_metric_name`), the latest of equal bests."""
    spec = spec.strip()
    shown = spec if len(spec) <= 40 else f"{spec[:40]}... ({len(spec)} characters)"
    if spec.isascii() and spec.isdigit():  # int() refuses "²"
        if len(spec) > 18:  # past int64, and past what int() parses at all (4300 digits): no run is that long
            raise ConfigError(f"step {shown} has {len(spec)} digits; no run has that many steps", what="compare --steps")
        return int(spec)
    if spec == "latest":
        if not val_steps:
            raise ConfigError("no validation trajectories are stored; nothing to compare", what="compare --steps")
        return max(val_steps)
    if spec == "best":
        for row in reversed(events(history, "stop")):
            if isinstance(row.get("best_step"), int):
                return row["best_step"]
        from groupwise.runs.report import val_metric_name

        metric = metric or val_metric_name(history)
        points = [(r["step"], value(r, "val", metric)) for r in rows(history, "val")] if metric else []
        points = [(s, v) for s, v in points if v is not None]
        if not points:
            raise ConfigError("'best' needs validation rows in the history; pass a step number", what="compare --steps")
        return max(points, key=lambda p: (p[1], p[0]))[0]  # latest of equal bests, as fit
    raise ConfigError(f"step {shown!r} must be a number, 'best' or 'latest'", what="compare --steps")


class RunView:
    """The read-only view of the run folder `path` (module doc). The history is read once, when first
    asked (`history`); trajectories are read from disk on each call."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @cached_property
    def history(self) -> list[Row]:
        """The history rows in written order (a line that does not parse is skipped with a warning); a
        StoreError naming the layout when the folder has no history.jsonl."""
        from groupwise.runs.store import load_history

        if not (self.path / "history.jsonl").exists():
            raise StoreError(f"{str(self.path)!r} has no history.jsonl; pass a run folder "
                             "<base_path>/<project>/models/<model>")
        return load_history(self.path, skip_corrupt=True)

    def val_metric(self) -> str | None:
        """The validation metric (`groupwise.runs.report.val_metric_name`); None when the run has none."""
        from groupwise.runs.report import val_metric_name

        return val_metric_name(self.history)

    def splits(self) -> list[str]:
        """The splits that have stored trajectories, sorted."""
        from groupwise.runs.store import trajectory_files

        return sorted({split for split, _, _ in trajectory_files(self.path)})

    def steps(self, split: str) -> list[int]:
        """The steps of `split` that have stored trajectories, ascending."""
        from groupwise.runs.store import trajectory_files

        return sorted({step for _, step, _ in trajectory_files(self.path, split)})

    def step(self, spec: str, split: str = "val") -> int:
        """The step `spec` names: a number, ``latest`` (of `split`'s stored steps) or ``best`` (`resolve_step`)."""
        return resolve_step(spec, self.history, self.steps(split))

    def trajectories(self, split: str | None = None, step: int | None = None, *,
                     skip_corrupt: bool = False) -> "list[TrajectoryGroup]":
        """The stored groups (of one split and/or step), by split, step and line (`load_trajectories`)."""
        from groupwise.runs.store import load_trajectories

        return load_trajectories(self.path, split, step, skip_corrupt=skip_corrupt)

    def by_scenario(self, split: str = "val") -> "list[TrajectoryGroup]":
        """`split`'s trajectories across every stored step, grouped by scenario: the messages before the
        first answer (the same prompt answered by different checkpoints); corrupt lines skipped."""
        from groupwise.core.trajectory import TrajectoryGroup

        found: dict[str, list] = defaultdict(list)
        for g in self.trajectories(split, skip_corrupt=True):
            for t in g.trajectories:
                msgs = t.messages()
                first = next((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
                found[json.dumps(msgs[:first], sort_keys=True, default=str)].append(t)
        return [TrajectoryGroup(ts, metadata={"scenario": f"{split} scenario {i}"})
                for i, ts in enumerate(found.values())]
