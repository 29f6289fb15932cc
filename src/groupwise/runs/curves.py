"""The typed reading of history rows: curves of `Point`s (a value with its confidence interval), alerts and
baselines as records. Pure Python, no I/O.

`RunHistory` (history.py) answers with these from its index (``train_curve``, ``validations``,
``alerts``, ``baselines``); `groupwise.runs.series` reads plain row lists (a report, a test) with the
same functions, so the loop's detectors and stopping rules get the same numbers from either.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, NamedTuple

from groupwise.config import DEFAULT_CONFIDENCE

__all__ = ["AlertRecord", "Point", "baseline_points", "interval", "points_of", "value", "z_score"]

Row = dict[str, Any]


def z_score(confidence: float) -> float:
    """The two-sided normal quantile of `confidence` (1.96 for 0.95)."""
    return NormalDist().inv_cdf(0.5 + confidence / 2)


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


@dataclass(frozen=True)
class AlertRecord:
    """An alert as the history holds it (split ``alert``): what, how bad, when, why, what was done."""

    step: int
    name: str
    severity: str = "warning"
    message: str = ""
    action: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Row) -> "AlertRecord":
        return cls(int(row["step"]), str(row.get("name", "")), str(row.get("severity", "warning")),
                   str(row.get("message", "")), row.get("action"), dict(row.get("evidence") or {}))


def value(row: Row, split: str, key: str) -> float | None:
    """``row[split/key]`` or ``row[key]`` as a finite float, else None."""
    for k in (f"{split}/{key}", key):
        v = row.get(k)
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)):
            try:
                v = float(v)
            except OverflowError:  # an integer past float's range, in a file written by hand or by an old version
                continue
            if math.isfinite(v):
                return v
    return None


def interval(row: Row, split: str, key: str) -> tuple[float, float] | None:
    """``(row[key_lo], row[key_hi])`` where the row carries the interval of `key`, else None."""
    lo, hi = value(row, split, f"{key}_lo"), value(row, split, f"{key}_hi")
    return None if lo is None or hi is None else (lo, hi)


def points_of(split_rows: Iterable[Row], split: str, key: str, *, up_to: int | None = None,
              confidence: float = DEFAULT_CONFIDENCE) -> list[Point]:
    """The curve of `key` over `split_rows` (one split's rows, one per step, by step), each point with its
    interval: the row's ``<key>_lo/_hi`` when logged; for the mean train reward, mean +- z x reward_std /
    sqrt(n_trajectories) when the row has both."""
    out = []
    for row in split_rows:
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


def baseline_points(baseline_rows: Iterable[Row], metric: str) -> dict[str, Point]:
    """{baseline name: its validation `metric` with its interval} of the ``baseline`` rows (the last row
    of a name wins)."""
    out: dict[str, Point] = {}
    for row in baseline_rows:
        v = value(row, "val", metric)
        if v is not None:
            out[str(row.get("name"))] = Point(0, v, *(interval(row, "val", metric) or (None, None)))
    return out
