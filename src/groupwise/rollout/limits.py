"""The limits of a gather: its exception budget, the rollout timeout's helpers, and the checks of its
arguments (gather.py says how they are applied)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from groupwise.errors import ConfigError

__all__ = ["CANCEL_GRACE_S", "check_gather_args", "exception_budget", "waiting_at"]

# How long a timed-out rollout may take to wind down once cancelled (its finally blocks, its own tasks)
# before the gather returns without it.
CANCEL_GRACE_S = 1.0


def exception_budget(max_exceptions: int | float, n_rollouts: int) -> int:
    """How many rollouts may raise: a count as is; a fraction x in (0, 1) allows the largest k with
    k / n_rollouts <= x, ART's test (``exceptions / total <= max_exceptions``), so that 0.05 of 18
    rollouts allows 0 and 0.57 of 100 allows 57 (``floor(0.57 * 100)`` is 56: the product rounds down).
    """
    if isinstance(max_exceptions, float) and 0 < max_exceptions < 1:
        if n_rollouts <= 0:
            return 0
        k = math.floor(max_exceptions * n_rollouts)
        while (k + 1) / n_rollouts <= max_exceptions:
            k += 1
        while k > 0 and k / n_rollouts > max_exceptions:
            k -= 1
        return k
    return int(max_exceptions)


def check_gather_args(max_exceptions: Any, max_concurrency: Any, after_each: Any, rollout_timeout_s: Any = None,
                      hang_after_s: Any = None) -> None:
    problems: list[str] = []
    for name, value, none in (("rollout_timeout_s", rollout_timeout_s, "no timeout"), ("hang_after_s", hang_after_s, "no watch")):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
        ):
            problems.append(f"{name}={value!r} must be None ({none}) or seconds > 0")
    if isinstance(max_exceptions, bool) or not isinstance(max_exceptions, (int, float)):
        problems.append(f"max_exceptions={max_exceptions!r} must be an int count or a float fraction in (0, 1)")
    elif not math.isfinite(max_exceptions) or max_exceptions < 0:
        problems.append(f"max_exceptions={max_exceptions!r} must be >= 0 (a count) or in (0, 1) (a fraction)")
    elif isinstance(max_exceptions, float) and max_exceptions >= 1 and not max_exceptions.is_integer():
        problems.append(
            f"max_exceptions={max_exceptions!r} is neither a fraction in (0, 1) nor a whole count; "
            "pass an int such as 3, or a fraction such as 0.1"
        )
    if max_concurrency is not None and (
        isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1
    ):
        problems.append(f"max_concurrency={max_concurrency!r} must be None (no cap) or an int >= 1")
    if after_each is not None and not callable(after_each):
        problems.append(f"after_each={after_each!r} must be None or a callable taking a TrajectoryGroup")
    if problems:
        raise ConfigError(problems, what="gather arguments")


def waiting_at(task: asyncio.Task, depth: int = 8) -> str:
    """Where a suspended task is waiting: one line per coroutine of its await chain, outermost first."""
    lines = []
    coro: Any = task.get_coro()
    while coro is not None and len(lines) < depth:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is None:
            break
        lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return "\n".join(lines)
