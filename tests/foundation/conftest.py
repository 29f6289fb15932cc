"""Fixtures of the foundation tests: a trajectory that uses every field."""

from __future__ import annotations

import pytest
from foundation_helpers import rich_trajectory

from groupwise import Trajectory, TrajectoryGroup


@pytest.fixture
def trajectory() -> Trajectory:
    return rich_trajectory()


@pytest.fixture
def group() -> TrajectoryGroup:
    g = TrajectoryGroup([rich_trajectory(0.75), rich_trajectory(0.25)], metadata={"scenario": 4},
                        metrics={"judge_cost": 0.002}, exceptions=[ValueError("rollout 3 failed")],
                        logs=["judged by local/smollm2-135m"])
    return g
