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


@pytest.mark.parametrize("bad", ["1.0", "nan", b"1"])
def test_a_reward_given_as_text_is_rejected_not_parsed(bad):
    with pytest.raises(ValidationError, match="reward is the .* a reward must be a number"):
        Trajectory(messages_and_choices=MSG, reward=bad)
    t = Trajectory(messages_and_choices=MSG)
    with pytest.raises(ValidationError, match="reward"):
        t.reward = bad
    assert t.reward == 0.0


def test_numeric_rewards_are_kept():
    assert [Trajectory(reward=r).reward for r in (1, 0.5, True)] == [1.0, 0.5, 1.0]


def test_unknown_role_names_the_index_and_role():
    with pytest.raises(ValidationError) as err:
        Trajectory(messages_and_choices=[{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    text = str(err.value)
    assert "messages_and_choices[1]" in text and "'robot'" in text


def _completion():
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate({
        "id": "x", "created": 0, "model": "m", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                     "message": {"role": "assistant", "content": "yo"}}]})


@pytest.mark.parametrize("item, says", [
    ("message", "is a ChatCompletionMessage; append the Choice, response.choices[0]"),
    ("completion", "is a ChatCompletion; append its Choice, response.choices[0]"),
    ("hello", "is a str; append a message dict"),
    (None, "is a NoneType; append a message dict"),
])
def test_an_item_that_is_no_message_says_what_to_append(item, says):
    """pydantic's own words were "Input should be a valid dictionary"; appending choice.message (a
    common slip) is named, with why the Choice is what trains. The error stays pydantic's
    ValidationError, as in ART."""
    completion = _completion()
    item = {"message": completion.choices[0].message, "completion": completion}.get(item, item)
    with pytest.raises(ValidationError) as err:
        Trajectory(messages_and_choices=[*MSG, item])
    assert "messages_and_choices[1] " + says in str(err.value)
    assert Trajectory(messages_and_choices=[*MSG, completion.choices[0]]).messages_and_choices[1].message.content == "yo"


def test_empty_group_and_trajectory_without_messages_are_valid_as_in_art():
    # ART accepts both (its defaults are []); an empty group is a record with no learning signal.
    assert TrajectoryGroup([]).trajectories == []
    assert TrajectoryGroup.model_validate({"trajectories": [], "exceptions": []}).exceptions == []
    t = Trajectory()
    assert t.messages_and_choices == [] and t.reward == 0.0
    t.messages_and_choices.append({"role": "user", "content": "hi"})
    assert t.messages() == MSG


def test_numpy_scalars_in_metrics_metadata_and_reward_become_python_scalars():
    import numpy as np

    t = Trajectory(messages_and_choices=MSG, reward=np.float32(0.5),
                   metrics={"a": np.float32(0.25), "b": np.int64(3), "c": np.bool_(True)},
                   metadata={"seed": np.int32(7)})
    assert t.reward == 0.5 and type(t.reward) is float
    assert t.metrics == {"a": 0.25, "b": 3, "c": True}
    assert [type(v) for v in t.metrics.values()] == [float, int, bool]
    assert type(t.metadata["seed"]) is int
    g = TrajectoryGroup([t], metrics={"judge": np.float64(0.1)})
    assert type(g.metrics["judge"]) is float


async def test_track_duration_adds_seconds_to_a_metric():
    t = Trajectory(messages_and_choices=MSG)
    async with t.track_duration("tool"):
        pass
    async with t.track_duration("tool"):
        pass
    assert t.metrics["tool_duration"] >= 0.0 and set(t.metrics) == {"tool_duration"}


async def test_group_of_only_pending_rollouts_is_valid():
    async def rollout() -> Trajectory:
        return Trajectory(messages_and_choices=MSG, reward=1.0)

    group = TrajectoryGroup(rollout() for _ in range(2))
    assert len(group.pending) == 2
    done = await group
    assert done.rewards() == [1.0, 1.0]


def test_trajectory_and_group_log_lines_as_arts():
    t = Trajectory(messages_and_choices=[{"role": "user", "content": "x"}])
    t.log(message="tool call failed")  # ART's parameter name
    group = TrajectoryGroup([t])
    group.log("judged by RULER")
    again = TrajectoryGroup.model_validate_json(group.model_dump_json())
    assert again.logs == ["judged by RULER"] and again.trajectories[0].logs == ["tool call failed"]


def test_str_and_for_logging_are_arts():
    from openai.types.chat.chat_completion import Choice
    from openai.types.chat.chat_completion_message import ChatCompletionMessage

    choice = Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content="4"))
    t = Trajectory(messages_and_choices=[*MSG, choice], reward=0.5, metrics={"ok": True}, metadata={"id": 7})
    t.log("looked up")
    # print(trajectory) in a ported loop shows the scores, not the whole conversation.
    assert str(t) == "Trajectory(reward=0.5, metrics={'ok': True}, metadata={'id': 7})"
    assert t.for_logging() == {
        "reward": 0.5, "initial_policy_version": None, "final_policy_version": None,
        "metrics": {"ok": True}, "metadata": {"id": 7}, "tools": None, "logs": ["looked up"],
        "messages": [{"role": "user", "content": "hi", "trainable": False},
                     {"role": "assistant", "content": "4", "trainable": True}],
    }


@pytest.mark.parametrize("make", [lambda m: Trajectory(messages_and_choices=MSG, metrics=m),
                                  lambda m: TrajectoryGroup([], metrics=m)])
def test_a_metric_given_as_text_is_refused_with_what_to_do(make):
    with pytest.raises(ValidationError, match=r"metrics \{'score': '0.8'\} are text.*float\(value\)"):
        make({"score": "0.8", "turns": 3})
    assert make({"score": 0.8}).metrics == {"score": 0.8}
