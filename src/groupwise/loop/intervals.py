"""How noisy a validation is: a confidence interval for the mean of a metric over held-out scenarios.

A validation on 24 scenarios that reads 0.35 could read 0.20 or 0.50 on another draw of the same policy,
so the detectors and stopping rules compare changes against this interval, never against a bare number.

- Every value 0 or 1 (accuracy, win rate): the Wilson score interval of the binomial proportion, which
  stays inside [0, 1] and behaves at 0/n and n/n where the normal approximation does not.
- Anything else (a rate per game, a reward): the percentile bootstrap over scenarios. Each scenario's
  rollouts are averaged first and scenarios are resampled with replacement, since the rollouts of one
  scenario are not independent of each other. The resampling is seeded: the same values give the
  same interval in every run and every resume.

Pure Python (no numpy): the client side and the loop import no heavy packages.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from groupwise.config import DEFAULT_CONFIDENCE
from groupwise.runs.curves import z_score

__all__ = ["Interval", "bootstrap_mean", "combined_noise", "mean_interval", "wilson", "z_score"]

BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class Interval:
    """A mean with its confidence interval [lo, hi], over `n` scenarios, computed by `method`."""

    mean: float
    lo: float
    hi: float
    n: int
    method: str  # "wilson" or "bootstrap"

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.lo:.3f}, {self.hi:.3f}]"


def wilson(successes: float, n: int, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of a proportion successes / n."""
    if n <= 0:
        return (math.nan, math.nan)
    z = z_score(confidence)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE, *, resamples: int = BOOTSTRAP_RESAMPLES,
                   seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (seeded, so it is reproducible)."""
    n = len(values)
    if n == 0:
        return (math.nan, math.nan)
    if n == 1:
        return (values[0], values[0])
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    lo = means[min(resamples - 1, max(0, int(math.floor(tail * resamples))))]
    hi = means[min(resamples - 1, max(0, int(math.ceil((1 - tail) * resamples)) - 1))]
    return (lo, hi)


def mean_interval(per_scenario: Sequence[Sequence[float]], confidence: float = DEFAULT_CONFIDENCE) -> Interval | None:
    """The mean of a metric over scenarios (each a list of its rollouts' values) with its interval.

    Wilson when every value is 0 or 1, else the bootstrap over scenario means. None without values.
    """
    scenarios = [list(map(float, v)) for v in per_scenario if len(v)]
    flat = [x for v in scenarios for x in v]
    if not flat:
        return None
    mean = sum(flat) / len(flat)
    if all(x in (0.0, 1.0) for x in flat):
        lo, hi = wilson(sum(flat), len(flat), confidence)
        return Interval(mean, lo, hi, len(scenarios), "wilson")
    lo, hi = bootstrap_mean([sum(v) / len(v) for v in scenarios], confidence)
    return Interval(mean, min(lo, mean), max(hi, mean), len(scenarios), "bootstrap")


def combined_noise(upper_half: float | None, lower_half: float | None) -> float:
    """How far apart two independent measurements must be before the gap is more than noise: the
    half-widths of their intervals on the sides that face each other, added in quadrature (the usual
    approximation for the difference of two independent estimates). A missing half-width counts 0."""
    return math.sqrt((upper_half or 0.0) ** 2 + (lower_half or 0.0) ** 2)
