"""Two runs' history rows compared: what two identical runs write differently is left out, named once.

A test that checks that two runs are the same run (resumed against uninterrupted, together against alone,
seeded twice) compares every field of their history rows but these, which measure the machine rather than
the run:
- when a row was written (``recorded_at``) and how long things took: ``time/...`` (the loop's phases),
  ``step_time``, ``update_time``, ``trainable_tokens_per_s``;
- ``memory/...``: the measured peak, and the micro-batch budget admitted against the device's free
  memory at that moment (training/step_memory.py), with the priced peak of that plan.
Anything else that differs is a difference between the runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["VOLATILE_KEYS", "VOLATILE_PREFIXES", "is_volatile", "stable_row", "stable_rows"]

VOLATILE_KEYS = frozenset({"recorded_at", "step_time", "update_time", "trainable_tokens_per_s"})
VOLATILE_PREFIXES = ("time/", "memory/")


def is_volatile(key: str) -> bool:
    """Whether a history field measures the machine (module doc), not the run."""
    return key in VOLATILE_KEYS or key.startswith(VOLATILE_PREFIXES)


def stable_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` without its volatile fields."""
    return {k: v for k, v in row.items() if not is_volatile(k)}


def stable_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each row without its volatile fields, in order."""
    return [stable_row(r) for r in rows]
