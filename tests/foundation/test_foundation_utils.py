"""retry, iterate_dataset (exact resume, ART's order), split_dataset (deterministic), limit_concurrency."""

from __future__ import annotations

import asyncio
import importlib

import random

import pytest

from groupwise import ConfigError, iterate_dataset, retry, split_dataset

# the module (the package attribute `groupwise.core.retry` is the function, as in ART)
RETRY = importlib.import_module("groupwise.core.retry")


def test_retry_sync_with_backoff(monkeypatch):
    sleeps, seen = [], []
    monkeypatch.setattr(RETRY.time, "sleep", sleeps.append)
    calls = 0

    @retry(max_attempts=4, delay=0.5, backoff_factor=3.0, exceptions=(KeyError,),
           on_retry=lambda exc, attempt: seen.append(attempt))
    def flaky():
        nonlocal calls
        calls += 1
        if calls < 3:
            raise KeyError("x")
        return "ok"

    assert flaky() == "ok"
    assert calls == 3 and seen == [1, 2]
    assert sleeps == [0.5, 1.5]  # delay, delay * factor


def test_retry_reraises_the_last_error_and_ignores_other_types(monkeypatch):
    monkeypatch.setattr(RETRY.time, "sleep", lambda s: None)
    calls = 0

    @retry(max_attempts=2, exceptions=ValueError)
    def always(kind):
        nonlocal calls
        calls += 1
        raise kind("no")

    with pytest.raises(ValueError):
        always(ValueError)
    assert calls == 2
    with pytest.raises(TypeError):  # not retried
        always(TypeError)
    assert calls == 3


async def test_retry_async(monkeypatch):
    sleeps = []

    async def fake_sleep(s):
        sleeps.append(s)

    monkeypatch.setattr(RETRY.asyncio, "sleep", fake_sleep)
    seen = []

    async def on_retry(exc, attempt):
        seen.append((type(exc).__name__, attempt))

    calls = 0

    @retry(max_attempts=3, delay=0.25, on_retry=on_retry)
    async def flaky():
        nonlocal calls
        calls += 1
        if calls < 3:
            raise ConnectionError("down")
        return calls

    assert await flaky() == 3
    assert seen == [("ConnectionError", 1), ("ConnectionError", 2)]
    assert sleeps == [0.25, 0.5]


def test_retry_bare_and_bad_args():
    @retry
    def f():
        return 1

    assert f() == 1
    with pytest.raises(ConfigError) as err:
        retry(max_attempts=0, delay=-1, backoff_factor=-2)
    assert len(err.value.problems) == 3


def test_iterate_dataset_batches_cover_each_epoch():
    batches = list(iterate_dataset(range(10), groups_per_step=4, num_epochs=2, use_tqdm=False))
    # ceil(10 / 4) = 3 steps per epoch (4, 4, 2 items), 2 epochs -> steps 0..5.
    assert [b.step for b in batches] == [0, 1, 2, 3, 4, 5]
    assert [(b.epoch, b.epoch_step) for b in batches] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [len(b.items) for b in batches] == [4, 4, 2, 4, 4, 2]
    for epoch in (0, 1):
        assert sorted(x for b in batches if b.epoch == epoch for x in b.items) == list(range(10))
    # Each epoch is shuffled differently.
    assert [x for b in batches[:3] for x in b.items] != [x for b in batches[3:] for x in b.items]


@pytest.mark.parametrize("k", [0, 1, 3, 4, 5])
def test_iterate_dataset_resumes_exactly(k):
    full = list(iterate_dataset(list("abcdefghij"), groups_per_step=4, num_epochs=2, seed=7, use_tqdm=False))
    resumed = list(iterate_dataset(list("abcdefghij"), groups_per_step=4, num_epochs=2, seed=7,
                                   initial_step=k, use_tqdm=False))
    assert resumed == full[k:]


def test_iterate_dataset_seed_changes_order_and_bad_args():
    a = [b.items for b in iterate_dataset(range(20), 5, seed=0, use_tqdm=False)]
    b = [b.items for b in iterate_dataset(range(20), 5, seed=1, use_tqdm=False)]
    assert a != b
    with pytest.raises(ConfigError) as err:
        list(iterate_dataset([], groups_per_step=0, num_epochs=0, initial_step=-1, use_tqdm=False))
    assert len(err.value.problems) == 4


def test_iterate_dataset_past_the_end_yields_nothing():
    assert list(iterate_dataset(range(4), 2, num_epochs=1, initial_step=9, use_tqdm=False)) == []


def test_iterate_dataset_seed_0_is_arts_order():
    # ART's iterate_dataset (0.3 to 0.5.18) seeds the global random with the epoch and shuffles range(n)
    # with it. The permutations below are what that gives for n=10.
    batches = list(iterate_dataset(list(range(10)), 3, num_epochs=2, use_tqdm=False))
    assert [b.items for b in batches] == [[7, 8, 1], [5, 3, 4], [2, 0, 9], [6],
                                          [6, 8, 9], [7, 5, 3], [0, 4, 1], [2]]


def test_iterate_dataset_seed_0_leaves_the_global_random_as_art_does():
    # A ported rollout drawing from `random` (a game's random tiles) must see ART's numbers: after each
    # epoch's first batch the global generator is where ART's random.seed(epoch) and shuffle left it.
    for epoch, batch in enumerate(iterate_dataset(list(range(10)), 10, num_epochs=2, use_tqdm=False)):
        drawn = [random.random() for _ in range(3)]
        random.seed(epoch)
        random.shuffle(list(range(10)))
        assert drawn == [random.random() for _ in range(3)]
    # Any other seed orders by its own generator and leaves the global one alone.
    random.seed(123)
    expected = random.random()
    random.seed(123)
    list(iterate_dataset(list(range(10)), 3, seed=5, use_tqdm=False))
    assert random.random() == expected


def test_iterate_dataset_at_arts_path_and_as_arts_tuple():
    from groupwise.core.iterate_dataset import iterate_dataset as at_art_path

    assert at_art_path is iterate_dataset
    # ART 0.3 yielded (items, epoch, global_step, epoch_step) tuples; 0.5 a DatasetBatch. Both read.
    for items, epoch, step, epoch_step in at_art_path(list("abcde"), 2, 2, initial_step=2, use_tqdm=False):
        assert (epoch, epoch_step) == divmod(step, 3) and 1 <= len(items) <= 2


async def test_limit_concurrency_caps_per_key_and_survives_new_event_loops():
    from groupwise.utils import limit_concurrency

    running: dict[str, int] = {}
    peak: dict[str, int] = {}

    @limit_concurrency(2, derive_key=lambda key, _i: key)
    async def work(key: str, _i: int) -> str:
        running[key] = running.get(key, 0) + 1
        peak[key] = max(peak.get(key, 0), running[key])
        await asyncio.sleep(0.01)
        running[key] -= 1
        return key

    out = await asyncio.gather(*(work(k, i) for k in "ab" for i in range(5)))
    assert out == ["a"] * 5 + ["b"] * 5
    assert peak == {"a": 2, "b": 2}  # two at a time per key, keys independent
    # the same decorated function in a fresh event loop (a semaphore bound to another loop would fail)
    import threading

    result = []
    thread = threading.Thread(target=lambda: result.append(asyncio.run(work("a", 0))))
    thread.start()
    thread.join()
    assert result == ["a"]
    with pytest.raises(ConfigError):
        limit_concurrency(0)


def test_split_dataset_deterministic_and_sized():
    a = split_dataset(range(100), seed=3)
    b = split_dataset(range(100), seed=3)
    assert a == b
    assert [len(p) for p in a] == [80, 10, 10]
    assert sorted(x for p in a for x in p) == list(range(100))  # a partition
    assert split_dataset(range(100), seed=4) != a
    # n=7, (0.5, 0.3, 0.2): exact 3.5, 2.1, 1.4 -> floors 3, 2, 1 -> leftover to remainder 0.5 -> 4, 2, 1.
    assert [len(p) for p in split_dataset(range(7), (0.5, 0.3, 0.2))] == [4, 2, 1]
    # 0.29 * 100 is 28.999999999999996 in floats: still 29.
    assert [len(p) for p in split_dataset(range(100), (0.29, 0.71))] == [29, 71]


def test_split_dataset_bad_fractions():
    with pytest.raises(ConfigError, match="sum to"):
        split_dataset(range(10), (0.5, 0.4))
    with pytest.raises(ConfigError, match="in \\[0, 1\\]"):
        split_dataset(range(10), (1.5, -0.5))


def test_iterate_dataset_takes_arts_argument_names():
    # ART programs call it by keyword: iterate_dataset(dataset=rows, groups_per_step=..., ...)
    by_name = list(iterate_dataset(dataset=list(range(5)), groups_per_step=2, num_epochs=1, initial_step=1,
                                   use_tqdm=False))
    assert by_name == list(iterate_dataset(list(range(5)), 2, 1, 1, False))
    assert [b.step for b in by_name] == [1, 2]
