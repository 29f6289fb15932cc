"""ART's `benchmark_rollout`: the mean reward of one group of rollouts of a (prompted) model."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from groupwise.errors import GatherError
from groupwise.core.trajectory import TrajectoryGroup

__all__ = ["benchmark_rollout"]


async def benchmark_rollout(model: str, num_rollouts: int,
                            rollout: Callable[[str, int, bool], Awaitable[Any]]) -> float:
    """Run ``rollout(model, i, False)`` for i in range(num_rollouts) as one group (ART's call: the model
    name, the rollout's index, and ``False`` for "not training"), print and return the mean reward of
    the trajectories that completed."""
    from groupwise.rollout.gather import gather_trajectory_groups

    groups = await gather_trajectory_groups([TrajectoryGroup(rollout(model, i, False) for i in range(num_rollouts))],
                                            pbar_desc="Benchmarking rollout")
    means = [sum(t.reward for t in g.trajectories) / len(g.trajectories) for g in groups if g.trajectories]
    if not means:
        raise GatherError(f"benchmark_rollout: none of the {num_rollouts} rollouts of {model!r} returned a trajectory")
    average = sum(means) / len(means)
    print(f"Average reward for {model}: {average}")
    return average
