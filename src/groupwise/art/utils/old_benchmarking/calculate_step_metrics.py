"""How much a step's groups disagree within themselves: the mean over groups of their rewards'
population standard deviation (ART's ``reward_std_dev`` of a benchmarked step)."""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["calculate_step_std_dev"]


def calculate_step_std_dev(trajectory_groups: list[Any]) -> float:
    """Mean of each group's reward std (ddof=0) over the groups with two or more trajectories; 0 when
    there is none. Exceptions kept in a group are not rewards and are left out."""
    spreads = []
    for group in trajectory_groups:
        rewards = [float(t.reward) for t in group.trajectories if not isinstance(t, BaseException)]
        if len(rewards) > 1:
            spreads.append(statistics.pstdev(rewards))
    return sum(spreads) / len(spreads) if spreads else 0
