"""`split_dataset`: a deterministic train/val/test split."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from typing import TypeVar

from groupwise.errors import ConfigError

__all__ = ["split_dataset"]

T = TypeVar("T")


def split_dataset(items: Iterable[T], fractions: Sequence[float] = (0.8, 0.1, 0.1),
                  seed: int = 0) -> tuple[list[T], ...]:
    """Shuffle `items` deterministically (by `seed`) and cut them into len(fractions) parts.

    Sizes are floor(fraction * n), and the items left over go one each to the parts with the
    largest remainders (ties: earlier part first), so the sizes always sum to n.
    Example: n=7, fractions (0.5, 0.3, 0.2) -> exact 3.5, 2.1, 1.4 -> floors 3, 2, 1 (6) -> the
    leftover item goes to the part with remainder 0.5 -> sizes 4, 2, 1.
    """
    items = list(items)
    fractions = list(fractions)
    problems = []
    if not fractions:
        problems.append("fractions is empty")
    bad = [f for f in fractions if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1]
    if bad:
        problems.append(f"fractions {bad} must each be a number in [0, 1]")
    elif fractions and not math.isclose(math.fsum(fractions), 1.0, abs_tol=1e-9):
        problems.append(f"fractions {fractions} sum to {math.fsum(fractions)}; they must sum to 1")
    if problems:
        raise ConfigError(problems, what="split_dataset arguments")
    n = len(items)
    exact = [f * n for f in fractions]
    sizes = [math.floor(x + 1e-9) for x in exact]
    leftovers = n - sum(sizes)
    by_remainder = sorted(range(len(fractions)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in by_remainder[:leftovers]:
        sizes[i] += 1
    order = list(range(n))
    random.Random(f"groupwise-split:{seed}").shuffle(order)
    parts, start = [], 0
    for size in sizes:
        parts.append([items[i] for i in order[start:start + size]])
        start += size
    return tuple(parts)
