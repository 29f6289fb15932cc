"""`groupwise.gather` (ART's `art.gather` context) and `groupwise.guided_completion` (ART's
`art.guided_completion`), with ART's semantics: what ART's self-play examples build their own
gathering on (they run in test_art_external.py)."""

from __future__ import annotations

import asyncio

import pytest
from openai.types.chat import ChatCompletion

import groupwise as gw
from groupwise.gather import GatherContext, get_gather_context, set_gather_context, wrap_group_awaitable, \
    wrap_trajectories_awaitable
from groupwise.guided_completion import get_guided_completion_params


async def game(reward_x: float, reward_o: float) -> list[gw.Trajectory]:
    return [gw.Trajectory(messages_and_choices=[], reward=reward_x, metrics={"win": 1.0}),
            gw.Trajectory(messages_and_choices=[], reward=reward_o, metrics={"win": 0.0})]


async def lost() -> list[gw.Trajectory]:
    raise ValueError("no move returned")


def test_a_context_sums_rewards_and_counts_failures_within_its_budget():
    async def main():
        context = GatherContext(max_exceptions=1)
        with set_gather_context(context):
            assert get_gather_context() is context
            results = await asyncio.gather(*(wrap_group_awaitable(g) for g in (game(1.0, 0.0), lost(), game(0.5, 0.5))))
        assert results[1] is None and [t.reward for t in results[0] + results[2]] == [1.0, 0.0, 0.5, 0.5]
        assert context.metric_sums["reward"] / context.metric_divisors["reward"] == 0.5
        assert (context.metric_sums["win"], context.metric_divisors["win"], context.metric_sums["exceptions"]) == (2.0, 4, 1)
        # one failure past the budget propagates
        with set_gather_context(GatherContext(max_exceptions=0)):
            with pytest.raises(ValueError, match="no move"):
                await asyncio.gather(wrap_group_awaitable(lost()))
        # a trajectory awaitable within budget returns its exception, as ART's
        with set_gather_context(GatherContext(max_exceptions=1)):
            assert isinstance(await wrap_trajectories_awaitable(lost()), ValueError)
        assert get_gather_context() is not context  # the block restored the outer context

    asyncio.run(main())


def test_a_group_given_as_a_trajectory_group_gathers_itself():
    async def main():
        with set_gather_context(GatherContext()):
            group = await wrap_group_awaitable(gw.TrajectoryGroup([game(1.0, 0.0)]))
        assert [t.reward for t in group] == [1.0, 0.0]

    asyncio.run(main())


def completion(message: dict) -> ChatCompletion:
    return ChatCompletion.model_validate({
        "id": "c", "object": "chat.completion", "created": 0, "model": "teacher",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}}]})


def test_guided_completion_params_from_a_teachers_answer_or_tool_call():
    assert get_guided_completion_params(completion({"content": "<move>B2</move>"})) == (["<move>B2</move>"], None, None)
    tool = {"type": "function", "function": {"name": "move", "parameters": {
        "type": "object", "properties": {"square": {"type": "string"}}, "required": ["square"]}}}
    call = {"content": None, "tool_calls": [{"id": "1", "type": "function",
                                             "function": {"name": "move", "arguments": '{"square": "C3"}'}}]}
    guided, tool_choice, tools = get_guided_completion_params(completion(call), [tool])
    assert guided is None and tool_choice == {"type": "function", "function": {"name": "move"}}
    assert tools[0]["function"]["parameters"]["properties"]["square"]["const"] == "C3"
    assert tool["function"]["parameters"]["properties"]["square"] == {"type": "string"}  # not mutated
    with pytest.raises(gw.GroupwiseError, match="base_tools"):
        get_guided_completion_params(completion(call))


def test_trajectory_group_batches_yields_the_first_groups_to_finish_in_batches():
    """ART's `trajectory_group_batches`: batches of `batch_size` finished groups (fastest first), the
    shorter last batch, `skip_batches` groups dropped, and a failed group left out within budget."""
    async def played(delay: float, reward: float) -> list[gw.Trajectory]:
        await asyncio.sleep(delay)
        return [gw.Trajectory(messages_and_choices=[], reward=reward)]

    async def main():
        delays = [0.05, 0.0, 0.03, 0.01, 0.02]  # reward i finishes in order 1, 3, 4, 2, 0
        batches = [[g[0].reward for g in b] async for b in gw.trajectory_group_batches(
            (played(d, float(i)) for i, d in enumerate(delays)), batch_size=2, pbar_desc=None)]
        assert batches == [[1.0, 3.0], [4.0, 2.0], [0.0]]
        skipped = [[g[0].reward for g in b] async for b in gw.trajectory_group_batches(
            (played(0.0, float(i)) for i in range(5)), batch_size=2, skip_batches=2, pbar_desc=None)]
        assert skipped == [[4.0]]
        kept = [[g[0].reward for g in b] async for b in gw.trajectory_group_batches(
            [played(0.0, 1.0), lost(), played(0.01, 2.0)], batch_size=2, max_batch_exceptions=1, pbar_desc=None)]
        assert kept == [[1.0, 2.0]]
        with pytest.raises(ValueError, match="no move"):
            async for _ in gw.trajectory_group_batches([lost(), played(0.0, 1.0)], batch_size=2, pbar_desc=None):
                pass

    asyncio.run(main())


async def test_gathering_sets_completion_tokens_as_arts_gather_does():
    # ART's gather sets each trajectory's completion_tokens: the mean sampled tokens per choice
    from openai.types.chat.chat_completion import Choice

    def choice(n: int) -> Choice:
        return Choice.model_validate({"index": 0, "finish_reason": "stop", "token_ids": list(range(n)),
                                      "message": {"role": "assistant", "content": "x" * n}})

    async def rollout(lengths: list[int]) -> gw.Trajectory:
        items: list = [{"role": "user", "content": "go"}]
        for n in lengths:
            items += [choice(n), {"role": "user", "content": "again"}]
        return gw.Trajectory(messages_and_choices=items[:-1], reward=1.0)

    async def awaited_group() -> gw.TrajectoryGroup:
        return gw.TrajectoryGroup([await rollout([6])])

    groups = await gw.gather_trajectory_groups([gw.TrajectoryGroup([rollout([2, 4]), rollout([3])]), awaited_group()],
                                               pbar_desc=None)
    assert [t.metrics["completion_tokens"] for g in groups for t in g.trajectories] == [3.0, 3.0, 6.0]
    plain = await gw.gather_trajectory_groups([gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[], reward=0.0)])],
                                              pbar_desc=None)
    assert "completion_tokens" not in plain[0].trajectories[0].metrics  # no choice, no count (as ART)
