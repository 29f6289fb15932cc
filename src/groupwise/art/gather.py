"""ART's gather context at ART's path (``art.gather``): `GatherContext`, `set_gather_context`,
`get_gather_context`, `wrap_group_awaitable`, `wrap_trajectories_awaitable`, `record_metrics`, with
ART's semantics, for programs that build their own gathering on them (ART's self-play examples group
each game's players by position with them). `gather_trajectory_groups` and `gather_trajectories`
here are groupwise's (`groupwise.rollout.gather`: one exception budget, timeouts, a progress bar).

The context is a context variable, as in ART: a wrapped awaitable reads the context that was current
when `asyncio.gather` made its task. It counts exceptions against `max_exceptions` (a count, or a
fraction of the bar's total in (0, 1)): within the budget a failed group is None and a failed
trajectory awaitable returns its exception, as ART's do; past it the exception propagates.
No torch here (client side).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import Counter
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from groupwise.rollout.gather import gather_trajectories, gather_trajectory_groups
from groupwise.core.trajectory import (
    Trajectory,
    TrajectoryGroup,
    enclosing_gather_budget,
    rollout_trajectories,
    set_completion_tokens,
)

__all__ = ["GatherContext", "gather_trajectories", "gather_trajectory_groups", "get_gather_context",
           "record_metrics", "set_gather_context", "wrap_group_awaitable", "wrap_trajectories_awaitable"]

# moved to the end of the bar's postfix, as ART orders them
_TOKEN_METRICS = ("prompt_tokens", "completion_tokens", "total_completion_tokens")


@dataclass
class GatherContext:
    """Running sums of a gather's rewards and metrics, its exception count and its bar (ART's)."""

    pbar: Any = None  # a tqdm bar, or None
    metric_sums: Counter = field(default_factory=Counter)
    metric_divisors: Counter = field(default_factory=Counter)
    max_metrics: int | None = None
    pbar_total_completion_tokens: bool = False
    max_exceptions: int | float = 0
    increment_pbar: bool = True

    def update_pbar(self, n: int) -> None:
        if self.pbar is None:
            return
        if self.increment_pbar:
            self.pbar.update(n)
        names = list(self.metric_sums)
        if self.max_metrics is not None:
            names = names[: self.max_metrics]
        postfix = {name: self.metric_sums[name] / max(1, self.metric_divisors[name]) for name in names}
        for key in _TOKEN_METRICS:
            if key in postfix:
                postfix[key] = postfix.pop(key)
        self.pbar.set_postfix(postfix)

    def too_many_exceptions(self) -> bool:
        failed = self.metric_sums["exceptions"]
        if 0 < self.max_exceptions < 1 and self.pbar is not None and self.pbar.total:
            return failed / self.pbar.total > self.max_exceptions
        return failed > self.max_exceptions

    def reset(self) -> None:
        self.pbar = None
        self.metric_sums = Counter()
        self.metric_divisors = Counter()
        self.pbar_total_completion_tokens = False
        self.max_exceptions = 0


_context: contextvars.ContextVar[GatherContext] = contextvars.ContextVar("gather_context")


@contextlib.contextmanager
def set_gather_context(context: GatherContext) -> Iterator[None]:
    """Make `context` current for the awaitables wrapped (and tasks made) inside the block. A
    `TrajectoryGroup` awaited there charges its failed rollouts to the context's budget and, within it,
    records them on the group (`groupwise.core.trajectory.enclosing_gather_budget`), as ART's groups do."""

    def charge(exc: BaseException) -> bool:
        context.metric_sums["exceptions"] += 1
        context.update_pbar(n=0)
        return not context.too_many_exceptions()

    token = _context.set(context)
    budget_token = enclosing_gather_budget.set(charge)
    try:
        yield
    finally:
        enclosing_gather_budget.reset(budget_token)
        _context.reset(token)


def get_gather_context() -> GatherContext:
    """The current context; outside any `set_gather_context`, a fresh one (budget 0, no bar)."""
    try:
        return _context.get()
    except LookupError:
        context = GatherContext()
        _context.set(context)
        return context


def record_metrics(context: GatherContext, trajectory: Trajectory) -> None:
    """Add a finished trajectory's reward and metrics to the running sums; its `completion_tokens`
    metric becomes the mean number of sampled tokens per choice (`set_completion_tokens`)."""
    set_completion_tokens([trajectory])
    context.metric_sums["reward"] += trajectory.reward
    context.metric_divisors["reward"] += 1
    context.metric_sums.update(trajectory.metrics)
    context.metric_divisors.update(trajectory.metrics.keys())


async def wrap_group_awaitable(awaitable: Awaitable[Any]) -> Any:
    """Await a group (a `TrajectoryGroup`, which runs its rollouts, or an awaitable of a group or of
    a rollout's trajectories), recording its trajectories; None when it failed within the budget. A
    `TrajectoryGroup` counts its own failed rollouts against the budget (see `set_gather_context`), as
    ART's: within it they are on the group, past it the failure propagates."""
    context = get_gather_context()
    if isinstance(awaitable, TrajectoryGroup):
        group = await awaitable
        for trajectory in group.trajectories:
            record_metrics(context, trajectory)
        context.update_pbar(n=len(group.trajectories))
        return group
    try:
        group = await awaitable
        trajectories = group.trajectories if isinstance(group, TrajectoryGroup) else \
            rollout_trajectories(group, "a group awaitable given to wrap_group_awaitable")
        for trajectory in [trajectories] if isinstance(trajectories, Trajectory) else trajectories:
            record_metrics(context, trajectory)
        context.update_pbar(n=1 if isinstance(trajectories, Trajectory) else len(trajectories))
        return group
    except BaseException:
        context.metric_sums["exceptions"] += 1
        context.update_pbar(n=0)
        if context.too_many_exceptions():
            raise
        return None


async def wrap_trajectories_awaitable(
    awaitable: Awaitable[Trajectory] | Awaitable[Iterable[Trajectory]],
) -> Trajectory | list[Trajectory] | BaseException:
    """Await one rollout (a trajectory, or several), recording them; its exception when it failed
    within the budget."""
    context = get_gather_context()
    try:
        result = rollout_trajectories(await awaitable, "a rollout given to wrap_trajectories_awaitable")
        for trajectory in [result] if isinstance(result, Trajectory) else result:
            record_metrics(context, trajectory)
        context.update_pbar(n=1)
        return result
    except BaseException as exc:
        context.metric_sums["exceptions"] += 1
        context.update_pbar(n=0)
        if context.too_many_exceptions():
            raise
        return exc
