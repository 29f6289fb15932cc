"""Same input, ART's result: behaviour a ported program relies on without seeing it.

Each expectation below is what ART's own code returns for the same input, found by running the
function from the released wheel (pure Python, no GPU) or, where it needs ART's services, by reading
it; the comment names the ART version. Differences groupwise keeps on purpose are in
docs/porting-from-art.md ("Names" and "Checked differences") and are not repeated here.
"""

from __future__ import annotations

import asyncio

import pytest
from openai.types.chat.chat_completion import Choice

import groupwise as gw
from groupwise.gather import GatherContext, set_gather_context
from groupwise.rollout.limits import exception_budget


def sampled(n: int) -> Choice:
    """A Choice whose logprobs name n sampled tokens (ART counts these)."""
    return Choice.model_validate({
        "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x" * n},
        "logprobs": {"content": [{"token": "x", "logprob": -1.0, "bytes": None, "top_logprobs": []}] * n}})


async def rollout(g: int, i: int, fail: bool = False) -> gw.Trajectory:
    await asyncio.sleep(0.001 * (g * 10 + i))
    if fail:
        raise ValueError(f"fail {g}/{i}")
    return gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}, sampled(3 + i), sampled(1)],
                         reward=g + i / 10)


async def test_a_group_awaited_on_its_own_gets_completion_tokens():
    # ART 0.5.18: `await art.TrajectoryGroup(...)` records each trajectory's completion_tokens (the mean
    # sampled tokens per choice), as its gather does: here (3+1)/2, (4+1)/2, (5+1)/2
    group = await gw.TrajectoryGroup(rollout(0, i) for i in range(3))
    assert [t.metrics["completion_tokens"] for t in group] == [2.0, 2.5, 3.0]


async def test_a_group_awaited_inside_a_gathered_coroutine_shares_the_gathers_budget():
    async def own_group(g: int, failing: int | None = None) -> gw.TrajectoryGroup:
        return await gw.TrajectoryGroup([rollout(g, i, fail=i == failing) for i in range(3)])

    # ART 0.5.18, max_exceptions=1: the failed rollout is on its group, the group's other two are kept
    groups = await gw.gather_trajectory_groups([own_group(0, failing=1), own_group(1)], max_exceptions=1,
                                               pbar_desc=None)
    assert [[t.reward for t in g] for g in groups] == [[0.0, 0.2], [1.0, 1.1, 1.2]]
    assert [[e.message for e in g.exceptions] for g in groups] == [["fail 0/1"], []]
    assert [t.metrics["completion_tokens"] for t in groups[0]] == [2.0, 3.0]
    # ART 0.5.18, max_exceptions=0: the gather fails (ART raises the rollout's ValueError; here the
    # GatherError caused by it, see docs/porting-from-art.md)
    with pytest.raises(gw.GatherError) as failed:
        await gw.gather_trajectory_groups([own_group(0, failing=1), own_group(1)], pbar_desc=None)
    assert isinstance(failed.value.__cause__, ValueError)


async def test_a_group_awaited_under_arts_gather_context_records_failures_within_its_budget():
    # ART 0.5.18's art.gather: a group awaited inside set_gather_context counts its failed rollouts there
    context = GatherContext(max_exceptions=1)
    with set_gather_context(context):
        group = await gw.TrajectoryGroup([rollout(0, 0), rollout(0, 1, fail=True), rollout(0, 2)])
        assert [t.reward for t in group] == [0.0, 0.2] and [e.message for e in group.exceptions] == ["fail 0/1"]
        assert context.metric_sums["exceptions"] == 1
        with pytest.raises(ValueError, match="fail 1/0"):  # the second failure is past the budget
            await gw.TrajectoryGroup([rollout(1, 0, fail=True), rollout(1, 1)])
    with pytest.raises(ValueError, match="fail 2/0"):  # outside any gather: no budget, as ART's default context
        await gw.TrajectoryGroup([rollout(2, 0, fail=True), rollout(2, 1)])


def test_a_fractional_exception_budget_is_arts_comparison():
    # ART (0.3.13 to 0.5.18) fails a gather once failures / rollouts > max_exceptions for 0 < it < 1.
    # floor(0.57 * 100) is 56 (the product is 56.99999999999999), but 57 / 100 <= 0.57 holds.
    assert exception_budget(0.57, 100) == 57
    assert exception_budget(0.05, 18) == 0 and exception_budget(0.1, 30) == 3 and exception_budget(0.5, 0) == 0
    for n in range(1, 120):
        for fraction in (0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.29, 0.3, 0.33, 0.5, 0.57, 0.7, 0.9, 0.99):
            k = exception_budget(fraction, n)
            assert k / n <= fraction and (k + 1) / n > fraction, (n, fraction, k)


async def test_a_gather_allows_exactly_arts_fraction_of_failures():
    async def run(failures: int) -> list[gw.TrajectoryGroup]:
        group = gw.TrajectoryGroup(rollout(0, 0, fail=i < failures) for i in range(100))
        return await gw.gather_trajectory_groups([group], max_exceptions=0.57, pbar_desc=None)

    # ART 0.5.18: 57 of 100 failures pass max_exceptions=0.57, 58 do not
    [group] = await run(57)
    assert (len(group.trajectories), len(group.exceptions)) == (43, 57)
    with pytest.raises(gw.GatherError):
        await run(58)


def test_a_list_or_dict_assigned_to_a_trajectory_is_the_trajectorys():
    # ART 0.5.18 stores an assigned object itself: turns appended to `messages` after
    # `trajectory.messages_and_choices = messages` are the trajectory's (here they went to a copy)
    trajectory = gw.Trajectory(reward=0.0)
    messages: list = [{"role": "user", "content": "q"}]
    trajectory.messages_and_choices = messages
    messages.append(sampled(2))
    metrics: dict = {}
    trajectory.metrics = metrics
    metrics["turns"] = 1
    assert len(trajectory.messages_and_choices) == 2 and trajectory.metrics == {"turns": 1}
    # what validation changes is still validated (a numpy scalar becomes a float) and refused
    numpy = pytest.importorskip("numpy")
    trajectory.metrics = {"score": numpy.float32(0.5)}
    assert type(trajectory.metrics["score"]) is float
    with pytest.raises(ValueError, match="must be a finite number"):
        trajectory.reward = float("inf")


def test_iterate_dataset_resumed_past_the_end_leaves_the_global_random_as_art():
    # ART 0.3.13 - 0.5.18 walk every epoch before skipping its steps, reseeding `random` with each:
    # a run resumed after its last step yields nothing and leaves the generator seeded by the last epoch
    import random

    random.seed(123)
    assert list(gw.iterate_dataset(list(range(4)), 2, 2, 9, False)) == []
    assert random.random() == 0.2550690257394217  # ART 0.5.18's next draw


def test_a_dataset_batch_is_a_plain_dataclass_as_arts():
    # ART 0.5.18's DatasetBatch is a mutable dataclass: a program may narrow a batch in place
    batch = next(iter(gw.iterate_dataset(list(range(4)), 2, use_tqdm=False)))
    batch.items = batch.items[:1]
    assert (len(batch.items), batch.step, batch.epoch, batch.epoch_step) == (1, 0, 0, 0)


def test_retry_warns_on_each_retry_and_takes_a_shrinking_backoff(monkeypatch, caplog):
    # ART 0.3.13 - 0.5.18: without on_retry each retry is a logging warning "Retry 1/3 for <name> after
    # error: <error>"; any backoff_factor multiplies the delay (0.5 shrinks it)
    import importlib
    import logging

    retry_module = importlib.import_module("groupwise.core.retry")
    sleeps: list[float] = []
    monkeypatch.setattr(retry_module.time, "sleep", sleeps.append)
    calls = 0

    @gw.retry(max_attempts=3, delay=1.0, backoff_factor=0.5)
    def ask() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("down")
        return "ok"

    with caplog.at_level(logging.WARNING):
        assert ask() == "ok"
    assert sleeps == [1.0, 0.5]
    assert [r.getMessage().split(" (next")[0] for r in caplog.records if r.levelno == logging.WARNING] == [
        "Retry 1/3 for ask after error: down", "Retry 2/3 for ask after error: down"]


async def test_ruler_of_no_trajectories_is_no_scores():
    # ART 0.5.18's ruler([]) returns [] before any request (no judge, no key needed)
    from groupwise.rewards import ruler

    assert await ruler([], "openai/o3") == []


def test_a_history_row_has_arts_reward_std_dev_and_group_metrics():
    from groupwise.runs.store import history_row

    def group(*rewards: float, **metrics: float) -> gw.TrajectoryGroup:
        return gw.TrajectoryGroup([gw.Trajectory(reward=r) for r in rewards], metrics=metrics)

    failed = gw.TrajectoryGroup([], exceptions=[ValueError("x")], metrics={"judge_s": 9.0})
    row = history_row([group(1.0, 0.0, judge_s=1.0), group(1.0, 1.0, judge_s=2.0), group(0.3), failed],
                      step=0, split="train")
    # ART 0.5.18's calculate_step_std_dev on these groups: (pstdev(1, 0) + pstdev(1, 1)) / 2, a group of one
    # left out; 0 (not NaN) when no group has two trajectories
    assert row["reward_std_dev"] == 0.25
    assert history_row([group(0.3)], step=0, split="train")["reward_std_dev"] == 0
    # ART 0.5.18's model.log averages a group metric over the groups holding trajectories: (1 + 2) / 2
    assert row["group_judge_s"] == 1.5
    assert row["exception_rate"] == 1 / 6  # ART 0.5.18: 1 exception among 5 trajectories and it


def test_a_step_on_the_default_learning_rate_says_arts_differs():
    # ART 0.3.13 - 0.5.18 train at 5e-6 when no rate is given (art.TrainConfig(), backend.train(model, groups));
    # groupwise's default is 1e-5 (docs/porting-from-art.md): a step that uses it names the difference
    import warnings

    from groupwise.core.compat import train_config_from_art

    with pytest.warns(gw.ArtCompatWarning, match="default 1e-05 applies; ART's default is 5e-06"):
        assert train_config_from_art(None, {}, where="semantics-none").learning_rate == 1e-5
    with pytest.warns(gw.ArtCompatWarning, match="ART's default is 5e-06"):
        train_config_from_art(gw.TrainConfig(beta=0.1), {}, where="semantics-config")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a rate given anywhere, or gw.fit's step config, is silent
        train_config_from_art(gw.TrainConfig(learning_rate=1e-5), {}, where="semantics-given")
        train_config_from_art(gw.TrainConfig(1e-5), {}, where="semantics-given-positionally")
        train_config_from_art(None, {"learning_rate": 5e-6}, where="semantics-option")
        train_config_from_art(gw.LoopConfig().step_config(), {}, where="semantics-fit")
        train_config_from_art(None, {}, where="semantics-none")  # once per process


def test_backend_train_without_a_loss_says_arts_default_is_cispo():
    # ART 0.5.18's LocalBackend.train(model, groups) defaults to loss_fn="cispo"; groupwise's default is PPO's
    # clipped ratio (ART 0.3 - 0.4's model.train loss): the backend's call names the difference once
    import warnings

    from groupwise.core.compat import train_config_from_art

    with pytest.warns(gw.ArtCompatWarning, match="default loss 'ppo' applies; ART's LocalBackend.train defaults to 'cispo'"):
        config = train_config_from_art(None, {"learning_rate": 1e-5}, where="LocalBackend.train", arts_loss="cispo")
    assert config.loss == "ppo"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert train_config_from_art(None, {"learning_rate": 1e-5, "loss_fn": "cispo"}, where="semantics-loss",
                                     arts_loss="cispo").loss == "cispo"
        train_config_from_art(None, {"learning_rate": 1e-5, "ppo": True}, where="semantics-loss", arts_loss="cispo")
        train_config_from_art(gw.TrainConfig(learning_rate=1e-5), {}, where="semantics-loss", arts_loss="cispo")
