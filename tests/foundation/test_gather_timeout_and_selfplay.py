"""Gathering: the per-rollout timeout (default on; a hung rollout no longer hangs a run silently) and
ART's result shapes (a rollout may return several trajectories, as a self-play game does)."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from groupwise import (
    GatherError,
    LoopConfig,
    Trajectory,
    TrajectoryGroup,
    gather_trajectories,
    gather_trajectory_groups,
    trajectory_group,
)
from groupwise.errors import RolloutResultError, RolloutTimeoutError


def traj(reward: float, who: str = "x") -> Trajectory:
    return Trajectory(messages_and_choices=[{"role": "user", "content": who}], reward=reward)


async def quick(reward: float, delay: float = 0.0) -> Trajectory:
    await asyncio.sleep(delay)
    return traj(reward)


async def never_returns() -> Trajectory:
    await asyncio.Event().wait()  # a request that never comes back
    raise AssertionError("unreachable")


def no_tasks_left() -> bool:
    return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []


# ------------------------------------------------------------------------------------------ timeout
def test_the_timeout_is_on_by_default_and_the_same_everywhere():
    default = LoopConfig().rollout_timeout_s
    assert default is not None and default > 0
    for fn in (gather_trajectory_groups, gather_trajectories, trajectory_group):
        assert inspect.signature(fn).parameters["rollout_timeout_s"].default == default


async def test_a_hung_rollout_times_out_and_is_recorded_on_its_group():
    groups = [TrajectoryGroup([quick(1.0), never_returns(), quick(2.0)]), TrajectoryGroup([quick(3.0)])]
    out = await gather_trajectory_groups(groups, pbar_desc=None, max_exceptions=1, rollout_timeout_s=0.2)
    assert [g.rewards() for g in out] == [[1.0, 2.0], [3.0]]
    [exc] = out[0].exceptions
    assert exc.type == "RolloutTimeoutError"
    assert "rollout 1 of group 0 did not finish within rollout_timeout_s=0.2" in exc.message
    assert "LoopConfig.rollout_timeout_s" in exc.message
    assert "in never_returns" in exc.message  # where it was waiting
    assert no_tasks_left()


async def test_a_timeout_over_the_budget_fails_the_gather_naming_the_setting():
    with pytest.raises(GatherError, match="1 of 2 rollouts raised") as err:
        await gather_trajectory_groups([TrajectoryGroup([quick(1.0), never_returns()])], pbar_desc=None,
                                       rollout_timeout_s=0.2)
    assert isinstance(err.value.__cause__, RolloutTimeoutError)
    assert "rollout_timeout_s=0.2" in str(err.value)
    assert no_tasks_left()


async def test_the_clock_starts_when_the_rollout_starts_not_while_it_waits_for_a_slot():
    # 5 rollouts of 0.1 s one at a time take 0.5 s in all; each is well inside its 0.35 s.
    group = TrajectoryGroup([quick(float(i), delay=0.1) for i in range(5)])
    [out] = await gather_trajectory_groups([group], pbar_desc=None, max_concurrency=1, rollout_timeout_s=0.35)
    assert out.rewards() == [0.0, 1.0, 2.0, 3.0, 4.0] and out.exceptions == []


async def test_a_rollout_that_ignores_its_cancellation_cannot_hang_the_gather(caplog):
    stop = asyncio.Event()

    async def stubborn() -> Trajectory:
        while not stop.is_set():
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                pass  # a bug: swallows the cancellation and carries on
        return traj(9.0)

    with caplog.at_level("WARNING", logger="groupwise.rollout.gather"):
        [out] = await gather_trajectory_groups([TrajectoryGroup([quick(1.0), stubborn()])], pbar_desc=None,
                                               max_exceptions=1, rollout_timeout_s=0.2)
    assert out.rewards() == [1.0] and out.exceptions[0].type == "RolloutTimeoutError"
    assert "ignored their cancellation" in caplog.text
    stop.set()
    await asyncio.sleep(0.1)  # let it end, so the test leaves no task behind
    assert no_tasks_left()


async def test_a_group_given_as_an_awaitable_times_out_as_one():
    async def one_group() -> TrajectoryGroup:
        return await TrajectoryGroup([quick(1.0), never_returns()])

    groups = await gather_trajectory_groups([one_group(), TrajectoryGroup([quick(2.0)])], pbar_desc=None,
                                            max_exceptions=1, rollout_timeout_s=0.2)
    assert [g.rewards() for g in groups] == [[], [2.0]]
    assert "group 0 (an awaitable that builds its group) did not finish" in groups[0].exceptions[0].message
    assert no_tasks_left()


async def test_gather_trajectories_and_trajectory_group_time_out_too():
    out = await gather_trajectories([quick(1.0), never_returns()], pbar_desc=None, max_exceptions=1,
                                    rollout_timeout_s=0.2)
    assert isinstance(out[0], Trajectory) and isinstance(out[1], RolloutTimeoutError)  # in its place, as in ART
    group = await trajectory_group([quick(1.0), never_returns()], return_exceptions=True, rollout_timeout_s=0.2)
    assert group.rewards() == [1.0] and group.exceptions[0].type == "RolloutTimeoutError"


async def test_bad_timeouts_are_refused():
    from groupwise import ConfigError

    for bad in (0, -1, float("inf"), "10", True):
        with pytest.raises(ConfigError, match="rollout_timeout_s"):
            await gather_trajectory_groups([], rollout_timeout_s=bad)
    with pytest.raises(ConfigError, match="rollout_timeout_s"):
        LoopConfig(rollout_timeout_s=0)
    assert LoopConfig(rollout_timeout_s=None).rollout_timeout_s is None  # no limit, on request


# ---------------------------------------------------------------------------------------- self-play
async def game(i: int):
    """One self-play game, two players: ART declares Awaitable[Iterable[Trajectory]] for this."""
    await asyncio.sleep(0)
    return traj(float(i), "x"), traj(-float(i), "o")


async def test_a_group_of_self_play_rollouts_holds_every_player_in_order():
    async def as_generator(i: int):
        return (t for t in await game(i))

    groups = [TrajectoryGroup([game(1), quick(5.0), as_generator(2)]), TrajectoryGroup([game(3)])]
    out = await gather_trajectory_groups(groups, pbar_desc=None)
    assert [g.rewards() for g in out] == [[1.0, -1.0, 5.0, 2.0, -2.0], [3.0, -3.0]]
    awaited = await TrajectoryGroup(game(i) for i in range(2))
    assert awaited.rewards() == [0.0, -0.0, 1.0, -1.0]


async def test_gather_trajectories_keeps_each_games_list_in_its_place_as_art_does():
    results = await gather_trajectories([game(i) for i in range(3)] + [quick(7.0)], pbar_desc=None)
    assert [type(r).__name__ for r in results] == ["list", "list", "list", "Trajectory"]
    assert [[t.reward for t in r] for r in results[:3]] == [[0.0, -0.0], [1.0, -1.0], [2.0, -2.0]]
    # ART's tic-tac-toe self-play regroups by player: one group of x's, one of o's
    x_group, o_group = (TrajectoryGroup(list(ts)) for ts in zip(*results[:3]))
    assert x_group.rewards() == [0.0, 1.0, 2.0] and o_group.rewards() == [-0.0, -1.0, -2.0]
    doubled = await gather_trajectories([game(1)], pbar_desc=None, after_each=lambda t: [t, t])
    assert [[t.reward for t in r] for r in doubled] == [[1.0, 1.0, -1.0, -1.0]]


async def test_a_generator_result_that_raises_is_a_failed_rollout_not_a_hang():
    async def half_a_game():
        def players():
            yield traj(1.0)
            raise RuntimeError("the game crashed after x moved")
        return players()

    [out] = await gather_trajectory_groups([TrajectoryGroup([half_a_game(), game(2)])], pbar_desc=None,
                                           max_exceptions=1)
    assert out.rewards() == [2.0, -2.0] and out.exceptions[0].message == "the game crashed after x moved"


@pytest.mark.parametrize("bad, said", [
    (("x", "o"), "returned a tuple whose item 0 is a str"),
    ([traj(1.0), None], "returned a list whose item 1 is a NoneType"),
    ("a string", "returned str"),
    (None, "returned NoneType"),
])
async def test_a_wrongly_typed_result_fails_loudly_whatever_the_budget(bad, said):
    async def wrong():
        return bad

    for gather in (lambda: gather_trajectory_groups([TrajectoryGroup([quick(1.0, delay=5), wrong()])],
                                                    pbar_desc=None, max_exceptions=0.9),
                   lambda: gather_trajectories([wrong()], pbar_desc=None, max_exceptions=1)):
        with pytest.raises(RolloutResultError, match=said) as err:
            await gather()
        assert "max_exceptions" not in str(err.value) and "self-play" in str(err.value)
        assert no_tasks_left()
    with pytest.raises(RolloutResultError, match=said):
        await TrajectoryGroup([wrong()])
    with pytest.raises(RolloutResultError, match="returned TrajectoryGroup"):
        await gather_trajectory_groups([TrajectoryGroup([trajectory_group([quick(1.0)])])], pbar_desc=None)


# ------------------------------------------------------------------ the clock stands still in a stall
def test_the_stall_clock_counts_the_union_of_its_sources_stalls():
    from groupwise.rollout.stalls import StallClock

    t = [0.0]
    clock = StallClock(now=lambda: t[0])
    a, b = object(), object()
    clock.set_stalled(a, True)       # 0: a stalls
    t[0] = 2.0
    clock.set_stalled(b, True)       # 2: b too (the union stays one interval)
    t[0] = 3.0
    clock.set_stalled(a, False)      # 3: a serves again, b still stalled
    t[0] = 5.0
    assert clock.seconds() == 5.0    # open interval counted up to now
    clock.set_stalled(b, False)      # 5: nobody stalled
    t[0] = 9.0
    clock.set_stalled(b, False)      # saying it twice changes nothing
    assert clock.seconds() == 5.0
    assert clock.rollout_time() == 4.0  # 9 s of wall time, 5 of them stalled


async def test_a_rollout_waiting_on_a_stalled_engine_does_not_time_out():
    # A shared engine paused for another run's update (or full) makes a rollout wait through no fault
    # of its own: its timeout does not count that time. The same rollout without the stall times out.
    from groupwise.rollout.stalls import STALLS

    engine = object()
    STALLS.set_stalled(engine, True)
    try:
        out = await gather_trajectory_groups([TrajectoryGroup([quick(1.0, delay=0.6)])], pbar_desc=None,
                                             rollout_timeout_s=0.2)
    finally:
        STALLS.set_stalled(engine, False)
    assert out[0].rewards() == [1.0] and out[0].exceptions == []
    out = await gather_trajectory_groups([TrajectoryGroup([quick(1.0, delay=0.6), quick(2.0)])], pbar_desc=None,
                                         max_exceptions=1, rollout_timeout_s=0.2)
    assert out[0].rewards() == [2.0] and [e.type for e in out[0].exceptions] == ["RolloutTimeoutError"]


async def test_a_hung_rollout_still_times_out_once_the_stall_ends():
    from groupwise.rollout.stalls import STALLS

    engine = object()
    STALLS.set_stalled(engine, True)
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, STALLS.set_stalled, engine, False)  # the update ends
    try:
        out = await gather_trajectory_groups([TrajectoryGroup([never_returns(), quick(1.0)])], pbar_desc=None,
                                             max_exceptions=1, rollout_timeout_s=0.2)
    finally:
        STALLS.set_stalled(engine, False)
    assert out[0].rewards() == [1.0] and [e.type for e in out[0].exceptions] == ["RolloutTimeoutError"]
    assert no_tasks_left()
