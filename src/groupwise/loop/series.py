"""Reading curves out of a run's history (pure; no I/O).

A history is the list of flat rows of `history.jsonl` (see `groupwise.store`), or the training process's
`groupwise.history.RunHistory` (the same rows in memory, indexed by split): each row has a `step`
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
from typing import Any, NamedTuple

from groupwise.history import RunHistory
from groupwise.loop.intervals import z_score

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


class Point(NamedTuple):
    """One measurement of a curve: its step, its value, and its confidence interval where known."""

    step: int
    value: float
    lo: float | None = None
    hi: float | None = None

    @property
    def below(self) -> float | None:
        """How far the interval reaches below the value (None without an interval)."""
        return None if self.lo is None else max(0.0, self.value - self.lo)

    @property
    def above(self) -> float | None:
        """How far the interval reaches above the value (None without an interval)."""
        return None if self.hi is None else max(0.0, self.hi - self.value)


def interval(row: Row, split: str, key: str) -> tuple[float, float] | None:
    """``(row[key_lo], row[key_hi])`` where the row carries the interval of `key`, else None."""
    lo, hi = value(row, split, f"{key}_lo"), value(row, split, f"{key}_hi")
    return None if lo is None or hi is None else (lo, hi)


def points(history: Iterable[Row], split: str, key: str, *, up_to: int | None = None,
           confidence: float = 0.95) -> list[Point]:
    """Like `series`, with each point's interval: the row's ``<key>_lo/_hi`` when logged; for the mean
    train reward, mean +- z x reward_std / sqrt(n_trajectories) when the row has both."""
    out = []
    for row in rows(history, split):
        if up_to is not None and row["step"] > up_to:
            continue
        v = value(row, split, key)
        if v is None:
            continue
        bounds = interval(row, split, key)
        if bounds is None and key == "reward":
            sd, n = value(row, split, "reward_std"), value(row, split, "n_trajectories")
            if sd is not None and n:
                half = z_score(confidence) * sd / math.sqrt(n)
                bounds = (v - half, v + half)
        out.append(Point(row["step"], v, *(bounds or (None, None))))
    return out


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
