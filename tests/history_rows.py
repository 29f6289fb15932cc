"""Two runs' history rows compared: what two identical runs write differently is left out, named once.

A test that checks that two runs are the same run (resumed against uninterrupted, together against alone,
seeded twice) compares every field of their history rows but the volatile ones, which measure the machine
rather than the run: when a row was written, how long things took, and memory (the run store names them:
`groupwise.runs.history.VOLATILE_FIELDS` and `VOLATILE_PREFIXES`, which scripts/reproduce_main_job.py
reads too). Anything else that differs is a difference between the runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from groupwise.runs.history import is_volatile, stable_rows

__all__ = ["is_volatile", "stable_row", "stable_rows"]


def stable_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` without its volatile fields."""
    return stable_rows([dict(row)])[0]

