"""`groupwise compare RUN_DIR --steps 0,best`: two steps' answers to the same validation scenarios,
side by side: the manual check for tasks without ground truth ("is the trained model better?").

It reads the stored validation trajectories of both steps (written by `fit` at every validation), pairs
groups by their ``scenario_index`` metadata (by position when absent), and prints, per scenario, the
prompt, then each step's first answer in two columns with its reward and metrics. Steps are numbers,
``best`` (the stop row's best step, else the best validation metric) or ``latest``.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

from groupwise.errors import ConfigError
from groupwise.loop.detectors import answer_text
from groupwise.runs.series import Row, events, rows, value

_BOOKKEEPING = ("answer_chars", "duration")


def resolve_step(spec: str, history: list[Row], val_steps: list[int], metric: str | None = None) -> int:
    """A step number from '12', 'best' or 'latest' (validation steps only)."""
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


def _prompt(group: Any) -> str:
    if not group.trajectories:
        return "(no trajectory: every rollout raised)"
    users = [m for m in group.trajectories[0].messages() if m.get("role") == "user"]
    content = users[-1].get("content") if users else ""
    return content if isinstance(content, str) else str(content)


def _label(step: int, group: Any) -> str:
    if not group or not group.trajectories:
        return f"step {step}: (missing)"
    t = group.trajectories[0]
    metrics = ", ".join(f"{k} {v:.3g}" for k, v in t.metrics.items() if k not in _BOOKKEEPING)
    return f"step {step}: reward {t.reward:.3g}" + (f", {metrics}" if metrics else "")


def side_by_side(left: str, right: str, width: int) -> list[str]:
    col = max(20, (width - 3) // 2)
    a = [line for para in left.splitlines() or [""] for line in textwrap.wrap(para, col) or [""]]
    b = [line for para in right.splitlines() or [""] for line in textwrap.wrap(para, col) or [""]]
    n = max(len(a), len(b))
    a += [""] * (n - len(a))
    b += [""] * (n - len(b))
    return [f"{x:<{col}} | {y}" for x, y in zip(a, b)]


def compare(run_dir: str | Path, steps: str, *, split: str, n: int, width: int | None = None) -> str:
    """The side-by-side text of two steps' answers on `split` (see the module docstring)."""
    from groupwise.runs.report import load_run
    from groupwise.runs.store import load_trajectories, trajectory_files

    history = load_run(run_dir)
    stored = sorted({s for sp, s, _ in trajectory_files(run_dir, split)})
    parts = [p for p in steps.split(",") if p.strip()]
    if len(parts) != 2:
        raise ConfigError(f"--steps {steps!r} must name two steps, e.g. 0,best", what="compare --steps")
    if not stored:  # a run without validation (a judged env) stores none: say which splits it has
        splits = sorted({sp for sp, _, _ in trajectory_files(run_dir)})
        raise ConfigError(f"this run stores no {split} trajectories; pass --split with one it has: "
                          f"{', '.join(splits) or 'none yet'}", what="compare --split")
    a, b = (resolve_step(p, history, stored) for p in parts)
    for s in (a, b):
        if s not in stored:
            raise ConfigError(f"no {split} trajectories stored for step {s}; stored steps: {stored}", what="compare --steps")
    width = width or shutil.get_terminal_size((120, 40)).columns
    ga, gb = load_trajectories(run_dir, split, a), load_trajectories(run_dir, split, b)

    def key(i: int, g: Any) -> Any:
        return g.metadata.get("scenario_index", i)

    by_b = {key(i, g): g for i, g in enumerate(gb)}
    out = [f"{Path(run_dir)}: {split} answers of step {a} (left) and step {b} (right)"]
    for i, g in enumerate(ga[:n]):
        other = by_b.get(key(i, g))
        out.append("=" * width)
        out.append(f"scenario {key(i, g)}: " + " ".join(_prompt(g).split())[: width * 3])
        out.append("-" * width)
        out.extend(side_by_side(_label(a, g), _label(b, other), width))
        out.append("-" * width)
        left = answer_text(g.trajectories[0]) if g.trajectories else ""
        right = answer_text(other.trajectories[0]) if other and other.trajectories else ""
        out.extend(side_by_side(left, right, width))
    return "\n".join(out)
