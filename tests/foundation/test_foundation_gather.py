"""gather_trajectory_groups: concurrency, exception budget, after_each, cancellation."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from groupwise import ConfigError, GatherError, Trajectory, TrajectoryGroup, gather_trajectories, gather_trajectory_groups
from groupwise.rollout.gather import exception_budget


async def rollout(i: int, *, fail: bool = False, delay: float = 0.0) -> Trajectory:
    await asyncio.sleep(delay)
    if fail:
        raise ValueError(f"rollout {i} failed")
    return Trajectory(messages_and_choices=[{"role": "user", "content": str(i)}], reward=float(i))


def groups_3x18(failing: set[int]) -> list[TrajectoryGroup]:
    """3 groups x 18 rollouts; rollout number g*18+i raises when it is in `failing`."""
    return [TrajectoryGroup(rollout(g * 18 + i, fail=(g * 18 + i) in failing) for i in range(18))
            for g in range(3)]


FAILING = {0, 5, 20, 40, 41}  # 5 failures: group 0 has 2, group 1 has 1, group 2 has 2


async def test_under_budget_records_exceptions_on_their_groups():
    groups = await gather_trajectory_groups(groups_3x18(FAILING), pbar_desc=None, max_exceptions=5)
    assert [len(g.trajectories) for g in groups] == [16, 17, 16]
    assert [len(g.exceptions) for g in groups] == [2, 1, 2]
    assert groups[0].exceptions[0].type == "ValueError"
    assert groups[0].exceptions[0].message == "rollout 0 failed"
    assert "Traceback" in groups[0].exceptions[0].traceback
    # Trajectories keep the order the rollouts were given in, not the order they finished in.
    assert groups[1].rewards() == [float(r) for r in range(18, 36) if r != 20]


async def test_over_budget_raises_naming_the_count():
    with pytest.raises(GatherError) as err:
        await gather_trajectory_groups(groups_3x18(FAILING), pbar_desc=None, max_exceptions=4)
    text = str(err.value)
    # Instant rollouts all finish in the loop's first pass, so all 5 failures are counted.
    assert text.startswith("5 of 54 rollouts raised an exception")
    assert "allows 4" in text and "rollout 0 failed" in text and "Traceback" in text
    # a gw.fit user never called gather: the message names the setting they pass
    assert "gw.LoopConfig(max_exceptions=0.1)" in text
    assert isinstance(err.value.__cause__, ValueError)


async def test_default_budget_is_zero():
    with pytest.raises(GatherError, match="1 of 54 rollouts raised"):
        await gather_trajectory_groups(groups_3x18({7}), pbar_desc=None)


def test_fraction_budget_is_floored():
    # 0.1 of 54 rollouts = 5.4 -> 5 allowed; 0.05 of 18 = 0.9 -> 0 allowed (never above the fraction).
    assert exception_budget(0.1, 54) == 5
    assert exception_budget(0.05, 18) == 0
    assert exception_budget(3, 54) == 3


async def test_fraction_budget_within_and_over():
    groups = await gather_trajectory_groups(groups_3x18(FAILING), pbar_desc=None, max_exceptions=0.1)
    assert sum(len(g.exceptions) for g in groups) == 5
    with pytest.raises(GatherError, match="6 of 54 rollouts raised.*max_exceptions=0.1 of 54 rollouts allows 5"):
        await gather_trajectory_groups(groups_3x18(FAILING | {50}), pbar_desc=None, max_exceptions=0.1)


async def test_over_budget_cancels_the_slow_rollouts():
    cancelled = 0

    async def slow() -> Trajectory:
        nonlocal cancelled
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled += 1
            raise
        raise AssertionError("unreachable")

    group = TrajectoryGroup([rollout(0, fail=True)] + [slow() for _ in range(17)])
    with pytest.raises(GatherError, match="1 of 18 rollouts raised"):
        await asyncio.wait_for(gather_trajectory_groups([group], pbar_desc=None), timeout=5)
    assert cancelled == 17


async def test_after_each_drop_replace_expand():
    seen = []

    def after_each(group: TrajectoryGroup):
        first = int(group.rewards()[0])
        seen.append(first)
        if first == 0:
            return None  # drop
        if first == 18:
            return TrajectoryGroup(group.trajectories[:2], metadata={"replaced": True})  # replace
        return [group, group]  # expand

    groups = await gather_trajectory_groups(groups_3x18(set()), pbar_desc=None, after_each=after_each)
    assert sorted(seen) == [0, 18, 36]
    assert len(groups) == 3
    assert groups[0].metadata == {"replaced": True} and len(groups[0]) == 2
    assert groups[1] is groups[2] and groups[1].rewards()[0] == 36.0


async def test_async_after_each_runs_while_other_groups_still_play():
    order = []

    async def after_each(group: TrajectoryGroup):
        order.append(("judged", group.metadata["n"]))
        await asyncio.sleep(0)
        group.metadata["judged"] = True
        return group

    async def tracked(n: int, delay: float) -> Trajectory:
        await asyncio.sleep(delay)
        order.append(("done", n))
        return Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=float(n))

    fast = TrajectoryGroup([tracked(0, 0.0)], metadata={"n": 0})
    slow = TrajectoryGroup([tracked(1, 0.05)], metadata={"n": 1})
    out = await gather_trajectory_groups([slow, fast], pbar_desc=None, after_each=after_each)
    assert [g.metadata["n"] for g in out] == [1, 0]  # input order kept
    assert all(g.metadata["judged"] for g in out)
    assert order.index(("judged", 0)) < order.index(("done", 1))  # judged before the slow one finished


async def test_after_each_error_propagates_and_cancels():
    def after_each(group):
        raise RuntimeError("judge down")

    group = TrajectoryGroup([rollout(0)])
    slow = TrajectoryGroup([rollout(1, delay=30)])
    with pytest.raises(RuntimeError, match="judge down") as err:
        await asyncio.wait_for(gather_trajectory_groups([group, slow], pbar_desc=None, after_each=after_each), 5)
    assert any("after_each on group 0" in note for note in err.value.__notes__)


async def test_max_concurrency_is_respected():
    in_flight = peak = 0

    async def counted(i: int) -> Trajectory:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=float(i))

    groups = [TrajectoryGroup(counted(i) for i in range(18)) for _ in range(3)]
    out = await gather_trajectory_groups(groups, pbar_desc=None, max_concurrency=4)
    assert peak == 4
    assert sum(len(g) for g in out) == 54

    peak = 0
    groups = [TrajectoryGroup(counted(i) for i in range(18)) for _ in range(3)]
    await gather_trajectory_groups(groups, pbar_desc=None)
    assert peak == 54  # uncapped: every rollout in flight at once


def _pending_tasks() -> list[asyncio.Task]:
    """The loop's tasks but this one. gc may finalize an openai client an earlier test in this process left
    behind, and the SDK's finalizer schedules its connection pool's aclose() on whichever loop runs: not a
    task of the gather under test."""
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()
            and not t.get_coro().__qualname__.endswith("aclose")]


async def test_cancellation_cancels_every_pending_rollout_cleanly():
    started = cancelled = 0

    async def slow(i: int) -> Trajectory:
        nonlocal started, cancelled
        started += 1
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled += 1
            raise
        raise AssertionError("unreachable")

    groups = [TrajectoryGroup(slow(i) for i in range(18)) for _ in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = asyncio.ensure_future(gather_trajectory_groups(groups, pbar_desc=None, max_concurrency=10))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gc.collect()
    # 10 were running and got cancelled; the 44 queued behind the semaphore were closed unstarted.
    assert (started, cancelled) == (10, 10)
    assert not [w for w in caught if "never awaited" in str(w.message)]
    assert _pending_tasks() == []


async def test_finished_groups_and_mixed_groups():
    done = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=9.0)])
    mixed = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "y"}], reward=1.0),
                             rollout(2)])
    out = await gather_trajectory_groups([done, mixed], pbar_desc=None)
    assert [g.rewards() for g in out] == [[9.0], [1.0, 2.0]]


async def test_rollout_returning_the_wrong_type_is_raised_whatever_the_budget():
    """A wrong result type is a bug in the rollout: recording it on the group within the budget would
    silently drop the episode, so it is raised at once (and the message does not suggest a budget)."""
    from groupwise.errors import RolloutResultError

    async def bad():
        return {"reward": 1}

    with pytest.raises(RolloutResultError, match="rollout 0 of group 0 returned dict, not a Trajectory") as err:
        await gather_trajectory_groups([TrajectoryGroup([bad(), rollout(1, delay=5)])], pbar_desc=None,
                                       max_exceptions=1)
    assert "max_exceptions" not in str(err.value)
    assert _pending_tasks() == []  # the slow one was cancelled


async def test_bad_arguments_are_reported_together():
    with pytest.raises(ConfigError) as err:
        await gather_trajectory_groups([], max_exceptions=-1, max_concurrency=0, after_each=3)
    assert len(err.value.problems) == 3
    coro = rollout(0)
    with pytest.raises(TypeError, match=r"groups\[0\] is list"):
        await gather_trajectory_groups([[coro]], pbar_desc=None)
    coro.close()


async def test_progress_bar_shows_counts(capsys):
    await gather_trajectory_groups(groups_3x18({3}), pbar_desc="train", max_exceptions=1)
    err = capsys.readouterr().err
    assert "train" in err and "54/54" in err and "exceptions=1" in err


async def test_gather_trajectories_flat_keeps_exceptions_in_place_as_art_does():
    out = await gather_trajectories([rollout(i, fail=i == 2) for i in range(5)], pbar_desc=None, max_exceptions=1)
    assert [type(t).__name__ for t in out] == ["Trajectory", "Trajectory", "ValueError", "Trajectory", "Trajectory"]
    assert [t.reward for t in out if isinstance(t, Trajectory)] == [0.0, 1.0, 3.0, 4.0]
    assert "rollout 2 failed" in str(out[2])
    out = await gather_trajectories([rollout(i) for i in range(3)], pbar_desc=None,
                                    after_each=lambda t: None if t.reward == 1.0 else [t, t])
    assert [t.reward for t in out] == [0.0, 0.0, 2.0, 2.0]


async def test_groups_given_as_coroutines_returning_a_group_as_in_art():
    async def one_group(s: int) -> TrajectoryGroup:
        if s == 1:
            raise RuntimeError("scenario 1 broke")
        return await TrajectoryGroup(rollout(10 * s + i) for i in range(3))

    groups = await gather_trajectory_groups([one_group(s) for s in range(3)], pbar_desc="g", max_exceptions=1,
                                            max_metrics=1, pbar_total_completion_tokens=False)
    assert [g.rewards() for g in groups] == [[0.0, 1.0, 2.0], [], [20.0, 21.0, 22.0]]
    assert groups[1].exceptions[0].message == "scenario 1 broke"  # recorded in its place, as data
    with pytest.raises(GatherError):  # over budget
        await gather_trajectory_groups([one_group(1)], pbar_desc=None)


async def test_pbar_total_completion_tokens_is_accepted_and_named_once():
    from groupwise.core.compat import ArtCompatWarning

    with pytest.warns(ArtCompatWarning, match="pbar_total_completion_tokens"):
        await gather_trajectory_groups([TrajectoryGroup([rollout(0)])], pbar_desc=None,
                                       pbar_total_completion_tokens=True)


async def test_trajectory_group_function_of_art_0_5():
    from groupwise import trajectory_group

    g = await trajectory_group([rollout(0), rollout(1, fail=True), rollout(2)], return_exceptions=True,
                               metadata={"s": 1})
    assert g.rewards() == [0.0, 2.0] and len(g.exceptions) == 1 and g.metadata == {"s": 1}
    with pytest.raises(GatherError):
        await trajectory_group([rollout(0), rollout(1, fail=True)])


def test_completion_tokens_metric_counts_sampled_tokens_in_either_logprobs_form():
    """A trajectory's `completion_tokens` is the mean number of tokens its choices sampled: from their
    token ids (groupwise's server, logprobs as one list or as entries) or, without ids, from the entries."""
    from openai.types.chat.chat_completion import Choice

    from groupwise.gather import GatherContext, record_metrics

    def choice(n: int, *, ids: bool, entries: bool) -> Choice:
        data = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"},
                "logprobs": {"content": [{"token": "x", "logprob": -1.0, "bytes": None, "top_logprobs": []}] * n}
                if entries else None}
        if ids:
            data.update(token_ids=list(range(n)), token_logprobs=None if entries else [-1.0] * n)
        return Choice.model_validate(data)

    user = {"role": "user", "content": "hi"}
    t = Trajectory(messages_and_choices=[user, choice(3, ids=True, entries=False), user,
                                         choice(5, ids=False, entries=True), user, choice(7, ids=True, entries=True)])
    record_metrics(GatherContext(), t)
    assert t.metrics["completion_tokens"] == 5.0
    plain = Trajectory(messages_and_choices=[user, choice(0, ids=False, entries=False)])
    record_metrics(GatherContext(), plain)
    assert "completion_tokens" not in plain.metrics
