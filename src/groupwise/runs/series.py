"""Reading curves out of a run's history (pure; no I/O).

A history is the list of flat rows of `history.jsonl` (see `groupwise.runs.store`), or the training process's
`groupwise.runs.history.RunHistory` (the same rows in memory, indexed by split): each row has a `step`
and a `split` (``train``, ``val``, ``test``) plus numbers such as ``reward``, ``reward_std`` and metric
means. The loop adds rows of its own splits:

- ``loop``: per-step bookkeeping (``time/gather_s``, ``time/train_s``, ``judge/cost_usd``, ...);
- ``alert``: one row per alert (``name``, ``severity``, ``message``, ``action``, ``evidence``);
- ``baseline``: one row per baseline (``name``, ``val/<metric>``, ``reward``);
- ``stop``: the stop decision (``rule``, ``reason``, ``best_step``).

A val (and test, and baseline) row also carries the confidence interval of its metric as
``<metric>_lo`` / ``<metric>_hi`` (``groupwise.loop.intervals``); `points` reads a curve with it. A train
row's mean reward has its noise in ``reward_std`` and ``n_trajectories``.

A metric may be stored as ``<split>/<name>`` or as the bare ``<name>``; `value` accepts both so the loop
does not depend on the prefixing choice of the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from groupwise.config import DEFAULT_CONFIDENCE
from groupwise.runs.curves import Point, interval, points_of, value
from groupwise.runs.history import RunHistory

__all__ = ["Point", "Row", "events", "interval", "latest_step", "mean", "points", "rows", "series", "std", "val_metric_name", "value"]

Row = dict[str, Any]


def rows(history: Iterable[Row], split: str) -> list[Row]:
    """Rows of one split, one per step (the last written wins: a resumed step overwrites), by step."""
    if isinstance(history, RunHistory):  # the training process's history: from its index, no scan
        return history.rows(split)
    by_step: dict[int, Row] = {}
    for row in history:
        if row.get("split") == split and isinstance(row.get("step"), int):
            by_step[row["step"]] = row
    return [by_step[s] for s in sorted(by_step)]


def series(history: Iterable[Row], split: str, key: str, *, up_to: int | None = None) -> list[tuple[int, float]]:
    """``[(step, value)]`` of one metric of one split, sorted by step, steps <= up_to."""
    out = []
    for row in rows(history, split):
        if up_to is not None and row["step"] > up_to:
            continue
        v = value(row, split, key)
        if v is not None:
            out.append((row["step"], v))
    return out


def points(history: Iterable[Row], split: str, key: str, *, up_to: int | None = None,
           confidence: float = DEFAULT_CONFIDENCE) -> list[Point]:
    """Like `series`, with each point's interval (`groupwise.runs.curves.points_of`)."""
    return points_of(rows(history, split), split, key, up_to=up_to, confidence=confidence)


def events(history: Iterable[Row], split: str) -> list[Row]:
    """All rows of an event split (``alert``, ``baseline``, ``stop``) in written order."""
    if isinstance(history, RunHistory):
        return history.events(split)
    return [row for row in history if row.get("split") == split]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def std(values: Sequence[float]) -> float:
    """Population standard deviation (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def latest_step(history: Iterable[Row]) -> int:
    """The highest step of any train row (0 before the first step)."""
    steps = [r["step"] for r in rows(history, "train")]
    return max(steps) if steps else 0


# Fields of a history row that are bookkeeping, never a metric (report.py's table skips them too).
BOOKKEEPING_FIELDS = frozenset({"step", "split", "recorded_at", "name", "kind", "evidence", "message", "severity",
                                "action", "rule", "reason", "scenarios", "best_metric"})


def val_metric_name(history: Sequence[Row]) -> str | None:
    """The validation metric: the stop row's ``best_metric`` when present; else, while the run trains, the
    metric its val rows give an interval for (fit computes one for the metric it selects on, and no other);
    else the first numeric field of the val rows that is not a bookkeeping field."""
    for row in reversed(events(history, "stop")):
        m = row.get("best_metric")
        if isinstance(m, str) and m.startswith("val/"):
            return m[4:]
    for row in rows(history, "val"):
        for k in row:
            if k.endswith("_lo") and f"{k[:-3]}_hi" in row and k[:-3] in row:
                return k[:-3].split("/", 1)[1] if k.startswith("val/") else k[:-3]
    for row in rows(history, "val"):
        for k, v in row.items():
            if k in BOOKKEEPING_FIELDS or k.startswith(("reward", "n_", "time/", "group_", "exception")) or k == "answer_chars":
                continue
            if k.endswith(("_lo", "_hi", "_n")):
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return k.split("/", 1)[1] if k.startswith("val/") else k
    return None
