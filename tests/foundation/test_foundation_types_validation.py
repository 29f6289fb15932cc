"""Each bad input gets a clear error that names the field."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from groupwise import Trajectory, TrajectoryGroup

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_reward_names_the_field(bad):
    with pytest.raises(ValidationError) as err:
        Trajectory(messages_and_choices=MSG, reward=bad)
    assert "reward" in str(err.value) and "finite" in str(err.value)


def test_non_finite_reward_assigned_later_is_rejected():
    # Rollouts set the reward after building the trajectory: validate_assignment catches it there.
    t = Trajectory(messages_and_choices=MSG)
    with pytest.raises(ValidationError, match="reward"):
        t.reward = float("nan")


def test_non_numeric_metric_names_the_field():
    with pytest.raises(ValidationError) as err:
        Trajectory(messages_and_choices=MSG, metrics={"score": "high"})
    assert "metrics.score" in str(err.value)


def test_unknown_role_names_the_index_and_role():
    with pytest.raises(ValidationError) as err:
        Trajectory(messages_and_choices=[{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    text = str(err.value)
    assert "messages_and_choices[1]" in text and "'robot'" in text


def test_empty_group_is_rejected_with_a_reason():
    with pytest.raises(ValueError, match="trajectories is empty"):
        TrajectoryGroup([])


def test_empty_group_from_the_store_is_rejected():
    with pytest.raises(ValidationError, match="trajectories is empty"):
        TrajectoryGroup.model_validate({"trajectories": [], "exceptions": []})


async def test_group_of_only_pending_rollouts_is_valid():
    async def rollout() -> Trajectory:
        return Trajectory(messages_and_choices=MSG, reward=1.0)

    group = TrajectoryGroup(rollout() for _ in range(2))
    assert len(group.pending) == 2
    done = await group
    assert done.rewards() == [1.0, 1.0]
