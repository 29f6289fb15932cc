"""`RunView`: one run folder, read. The history, the stored trajectories by split and step (as validated
groups, as raw rows, with each step's summary), the validation metric, the steps a reader names (a
number, ``best``, ``latest``) and whether a process is writing the run, answered one way for every reader.

A reader of a run asks the same questions: which rows, which metric, which step is the best, which
trajectories of which step, is the run still training. Every reader of a run folder asks them here and
opens none of the store's files itself: `groupwise compare` (runs/compare.py), `groupwise report`
(runs/report.py, jobs/report.py), `groupwise inspect` (runs/transcript.py, jobs/inspect.py), the judge's
labelled sets from a run (judge/eval_command.py) and the dashboard (dashboard/); tests/layers_check.py
keeps them off runs/store.py, runs/history.py and runs/lock.py. So a run's metric and its best step are
one answer everywhere, and a change of the store's layout is made here once. A view writes nothing and
takes no lock: it reads a run while it trains.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import defaultdict
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from groupwise.errors import ConfigError, StoreError
from groupwise.runs.history import load_history
from groupwise.runs.lock import RunLock
from groupwise.runs.series import Row, events, rows, val_metric_name, value
from groupwise.runs.step_summary import read_summary
from groupwise.runs.store import find_runs, is_run_dir, load_trajectories, read_group_dicts, read_groups, trajectory_files

if TYPE_CHECKING:
    from groupwise.core.trajectory import TrajectoryGroup

# The file-level readers are the view's too: a reader that caches by file (the dashboard's `GroupCache`,
# keyed by each file's size and time) reads one file of `RunView.files` with them.
__all__ = ["RunView", "StepFile", "find_runs", "is_run_dir", "load_history", "read_group_dicts", "read_groups",
           "read_summary", "resolve_step"]

# One stored step of trajectories: (split, step, its file); `RunView.files` lists them.
StepFile = tuple[str, int, Path]


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
        metric = metric or val_metric_name(history)
        points = [(r["step"], value(r, "val", metric)) for r in rows(history, "val")] if metric else []
        points = [(s, v) for s, v in points if v is not None]
        if not points:
            raise ConfigError("'best' needs validation rows in the history; pass a step number", what="compare --steps")
        return max(points, key=lambda p: (p[1], p[0]))[0]  # latest of equal bests, as fit
    raise ConfigError(f"step {shown!r} must be a number, 'best' or 'latest'", what="compare --steps")


class RunView:
    """The read-only view of the run folder `path` (module doc). The history is read once, when first
    asked (`history`); trajectories are read from disk on each call. `watch`: the view of a run being
    watched as it trains (the dashboard): the history's corrupt lines are skipped without a warning (a
    page shows what it can read), and a folder without history.jsonl yet has no rows rather than raising."""

    def __init__(self, path: str | Path, *, watch: bool = False) -> None:
        self.path = Path(path)
        self.watch = watch

    @cached_property
    def history(self) -> list[Row]:
        """The history rows in written order (a line that does not parse is skipped with a warning); a
        StoreError naming the layout when the folder has no history.jsonl (unless `watch`: no rows)."""
        if not self.watch and not (self.path / "history.jsonl").exists():
            raise StoreError(f"{str(self.path)!r} has no history.jsonl; pass a run folder "
                             "<base_path>/<project>/models/<model>")
        return load_history(self.path, skip_corrupt=True, warn=not self.watch)

    def history_age(self) -> float:
        """Seconds since history.jsonl was last written (infinite when there is none)."""
        path = self.path / "history.jsonl"
        try:
            return time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return math.inf

    def writer_pid(self) -> int | None:
        """The pid of the process that holds the run's writer lock now, as /proc/locks shows it (0 when it
        names none); None when nobody holds it or the system shows no locks. Seen rather than tried: a
        reader that held the lock even for a moment could make a starting `groupwise train` fail with
        `RunLockedError`."""
        try:
            st = os.stat(self.path / RunLock.FILE)
            with open("/proc/locks", encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"  # the file, as /proc/locks names it
        for line in lines:
            # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234 0 EOF" (a waiting lock has "->" after the number)
            parts = [p for p in line.split() if p != "->"]
            if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5] == where:
                return int(parts[4]) if parts[4].isdigit() else 0
        return None

    def lock_taken(self) -> bool:
        """Whether a job ever took the folder (its writer lock file exists, held or not)."""
        return (self.path / RunLock.FILE).exists()

    def val_metric(self) -> str | None:
        """The validation metric (`groupwise.runs.series.val_metric_name`); None when the run has none."""
        return val_metric_name(self.history)

    def files(self, split: str | None = None, step: int | None = None) -> list[StepFile]:
        """The stored trajectory files (of one split and/or step), by split and step."""
        return trajectory_files(self.path, split, step)

    def splits(self) -> list[str]:
        """The splits that have stored trajectories, sorted."""
        return sorted({split for split, _, _ in self.files()})

    def steps(self, split: str) -> list[int]:
        """The steps of `split` that have stored trajectories, ascending."""
        return sorted({step for _, step, _ in self.files(split)})

    def step(self, spec: str, split: str = "val") -> int:
        """The step `spec` names: a number, ``latest`` (of `split`'s stored steps) or ``best`` (`resolve_step`)."""
        return resolve_step(spec, self.history, self.steps(split))

    def trajectories(self, split: str | None = None, step: int | None = None, *,
                     skip_corrupt: bool = False) -> "list[TrajectoryGroup]":
        """The stored groups (of one split and/or step), by split, step and line (`load_trajectories`)."""
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
