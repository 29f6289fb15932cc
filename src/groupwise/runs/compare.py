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
from groupwise.runs.step_summary import answer_text
from groupwise.runs.view import RunView, resolve_step

__all__ = ["compare", "resolve_step", "side_by_side"]

_BOOKKEEPING = ("answer_chars", "duration")


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
    run = RunView(run_dir)
    history = run.history
    stored = run.steps(split)
    parts = [p for p in steps.split(",") if p.strip()]
    if len(parts) != 2:
        raise ConfigError(f"--steps {steps!r} must name two steps, e.g. 0,best", what="compare --steps")
    if not stored:  # a run without validation (a judged env) stores none: say which splits it has
        raise ConfigError(f"this run stores no {split} trajectories; pass --split with one it has: "
                          f"{', '.join(run.splits()) or 'none yet'}", what="compare --split")
    a, b = (resolve_step(p, history, stored) for p in parts)
    for s in (a, b):
        if s not in stored:
            raise ConfigError(f"no {split} trajectories stored for step {s}; stored steps: {stored}", what="compare --steps")
    width = width or shutil.get_terminal_size((120, 40)).columns
    ga, gb = run.trajectories(split, a), run.trajectories(split, b)

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
