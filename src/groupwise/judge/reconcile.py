"""Pure maths of RULER's orders and reconciliation: pass orders, chunk anchors, alignment, Spearman.

Kept apart from ruler.py (orchestration) so each function can be tested with hand-computed numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from groupwise.judge.parse import Score


def pass_orders(n: int, passes: int, seed: int) -> list[list[int]]:
    """The order of the distinct trajectories in each pass: rotations of one seeded shuffle."""
    base = list(range(n))
    random.Random(seed).shuffle(base)
    orders = []
    for p in range(passes):
        if passes <= n:
            shift = round(p * n / passes)
            orders.append(base[shift:] + base[:shift])
        else:  # more passes than positions: rotations would repeat, use fresh seeded shuffles
            order = list(range(n))
            random.Random(f"{seed}/{p}").shuffle(order)
            orders.append(order)
    return orders


def pick_anchors(chunk0: dict[int, Score], k: int) -> list[int]:
    """k trajectories of the first chunk spread over its score range: worst, ..., middle, ..., best."""
    ranked = sorted(chunk0, key=lambda u: (chunk0[u].score, u))
    if k == 1:
        return [ranked[len(ranked) // 2]]
    picks = [ranked[round(j * (len(ranked) - 1) / (k - 1))] for j in range(k)]
    return list(dict.fromkeys(picks))


def align(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(a, b) of the least-squares line y ~ a*x + b; offset only if x is flat or the slope <= 0."""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxx = sum((xi - mx) ** 2 for xi in x)
    if sxx < 1e-9:
        return 1.0, my - mx
    a = sum((xi - mx) * (yi - my) for xi, yi in zip(x, y)) / sxx
    if a <= 0:
        return 1.0, my - mx
    return a, my - a * mx


def spearman(u: Sequence[float], v: Sequence[float]) -> float | None:
    """Spearman rank correlation (average ranks for ties); None when either side is constant."""

    def ranks(xs: Sequence[float]) -> list[float]:
        order = sorted(range(len(xs)), key=lambda i: xs[i])
        r = [0.0] * len(xs)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    ru, rv = ranks(u), ranks(v)
    mu, mv = sum(ru) / len(ru), sum(rv) / len(rv)
    cov = sum((a - mu) * (b - mv) for a, b in zip(ru, rv))
    su = math.sqrt(sum((a - mu) ** 2 for a in ru))
    sv = math.sqrt(sum((b - mv) ** 2 for b in rv))
    if su == 0 or sv == 0:
        return None
    return cov / (su * sv)
