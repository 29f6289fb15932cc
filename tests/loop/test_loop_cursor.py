"""The loop's data cursor: saved with every step's checkpoint through `model.train(cursor=...)`, and the
position a restarted `fit` continues from."""

from __future__ import annotations

import asyncio

import pytest
from loop_helpers import SCENARIOS, ScriptedBackend, make_rollout, steady_answer, steady_validate

import groupwise as gw
from groupwise.loop.cursor import DataCursor, batches, resume_cursor
from groupwise.utils import epoch_order, iterate_dataset


def test_cursor_batches_are_iterate_datasets_and_the_cursor_counts_scenarios():
    got = list(batches(DataCursor(0, 0, seed=3, num_scenarios=7), groups_per_step=3, num_epochs=2))
    expected = list(iterate_dataset(list(range(7)), 3, 2, seed=3, use_tqdm=False))
    assert [chunk for chunk, _ in got] == [b.items for b in expected]
    # after each batch: the next scenario's place; an epoch's end moves to the next epoch
    assert [(c.epoch, c.offset) for _, c in got] == [(0, 3), (0, 6), (1, 0), (1, 3), (1, 6), (2, 0)]
    # resuming mid-epoch with another batch size continues at the same scenario
    rest = [chunk for chunk, _ in batches(DataCursor(0, 3, 3, 7), groups_per_step=2, num_epochs=1)]
    assert sum(rest, []) == epoch_order(7, 3, 0)[3:]


def test_resume_cursor_checks_the_dataset_and_derives_old_checkpoints():
    assert resume_cursor({}, step=0, num_scenarios=8, groups_per_step=2, seed=0) == DataCursor(0, 0, 0, 8)
    saved = DataCursor(1, 4, 0, 8).to_dict()
    assert resume_cursor(saved, step=6, num_scenarios=8, groups_per_step=2, seed=0) == DataCursor(1, 4, 0, 8)
    # a checkpoint without a cursor: the position 5 steps of 2 reach (4 steps per epoch)
    assert resume_cursor({"note": 1}, step=5, num_scenarios=8, groups_per_step=2, seed=0) == DataCursor(1, 2, 0, 8)
    with pytest.raises(gw.ConfigError, match="trained on 8 scenarios"):
        resume_cursor(saved, step=6, num_scenarios=9, groups_per_step=2, seed=0)


def test_a_warm_start_used_no_scenario(caplog):
    # after 2 SFT steps (demonstrations, no cursor) GRPO begins at the start, without the warning; after 2
    # SFT steps and 5 GRPO steps without a cursor, the position is what the 5 reach
    with caplog.at_level("WARNING", logger="groupwise.loop"):
        assert resume_cursor({}, step=2, num_scenarios=8, groups_per_step=2, seed=3, sft_steps=2) == DataCursor(0, 0, 3, 8)
    assert not caplog.records
    assert resume_cursor({}, step=7, num_scenarios=8, groups_per_step=2, seed=0, sft_steps=2) == DataCursor(1, 2, 0, 8)
    assert "continuing at the position 5 steps" in caplog.records[-1].getMessage()


def test_fit_saves_the_cursor_with_each_step_and_resumes_from_it(tmp_path):
    async def run(max_steps: int, groups_per_step: int):
        model = gw.TrainableModel("cursor", project="loop", base_model="none", base_path=str(tmp_path))
        backend = ScriptedBackend()
        await model.register(backend)
        config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=groups_per_step, eval_every=100,
                               max_steps=max_steps, patience=100, num_epochs=2)
        await gw.fit(model, make_rollout(steady_answer), SCENARIOS[:8], val_scenarios=SCENARIOS[8:10],
                     validate=steady_validate, config=config)
        return backend, await backend.checkpoint_cursor(model)

    backend, cursor = asyncio.run(run(max_steps=3, groups_per_step=2))
    assert cursor == {"epoch": 0, "offset": 6, "seed": 0, "num_scenarios": 8}
    first = [i for step in backend.trained_on for i in step]
    # resumed with 3 groups a step: the data position (6 scenarios into epoch 0) is kept, not 3 steps x 3
    backend, cursor = asyncio.run(run(max_steps=5, groups_per_step=3))
    assert cursor == {"epoch": 1, "offset": 3, "seed": 0, "num_scenarios": 8}
    order = epoch_order(8, 0, 0) + epoch_order(8, 0, 1)
    assert first + [i for step in backend.trained_on for i in step] == order[:11]
    assert [len(step) for step in backend.trained_on] == [2, 3]  # the epoch's rest, then a new epoch
