"""Reading curves out of a run's history (pure; no I/O).

A history is the list of flat rows of `history.jsonl` (see `groupwise.store`): each row has a `step`
and a `split` (``train``, ``val``, ``test``) plus numbers such as ``reward``, ``reward_std`` and metric
means. The loop adds rows of its own splits:

- ``loop``: per-step bookkeeping (``time/gather_s``, ``time/train_s``, ``judge/cost_usd``, ...);
- ``alert``: one row per alert (``name``, ``severity``, ``message``, ``action``, ``evidence``);
- ``baseline``: one row per baseline (``name``, ``val/<metric>``, ``reward``);
- ``stop``: the stop decision (``rule``, ``reason``, ``best_step``).

A metric may be stored as ``<split>/<name>`` or as the bare ``<name>``; `value` accepts both so the loop
does not depend on the prefixing choice of the store.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

Row = dict[str, Any]


def value(row: Row, split: str, key: str) -> float | None:
    """``row[split/key]`` or ``row[key]`` as a finite float, else None."""
    for k in (f"{split}/{key}", key):
        v = row.get(k)
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(v):
            return float(v)
    return None


def rows(history: Iterable[Row], split: str) -> list[Row]:
    """Rows of one split, one per step (the last written wins: a resumed step overwrites), by step."""
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


def events(history: Iterable[Row], split: str) -> list[Row]:
    """All rows of an event split (``alert``, ``baseline``, ``stop``) in written order."""
    return [row for row in history if row.get("split") == split]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def std(values: Sequence[float]) -> float:
    """Population standard deviation (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def window_mean(points: Sequence[tuple[int, float]], end_step: int, width: int) -> float | None:
    """Mean of the last `width` values at steps <= end_step (None when there are none)."""
    vals = [v for s, v in points if s <= end_step][-width:]
    return mean(vals) if vals else None


def latest_step(history: Iterable[Row]) -> int:
    """The highest step of any train row (0 before the first step)."""
    steps = [r["step"] for r in rows(history, "train")]
    return max(steps) if steps else 0
