"""ART 0.5's SFT helpers (`art.utils.sft`), as ART's SFT docs use them: training from a JSONL file of
chat examples, and a data set cut into `train_sft` calls under one learning-rate schedule, then RL
continuing from the SFT step. `import groupwise as art` is the only change; tiny random model."""

from __future__ import annotations

import json
import random

import pytest

import groupwise as art  # the only change an ART program needs
from groupwise.local import LocalBackend
from groupwise.utils.sft import (create_lr_schedule, create_sft_dataset_iterator, iterate_file, resolve_sft_batch_size,
                                 train_sft_from_file)


def test_lr_schedules_warm_up_then_decay_to_the_floor():
    # warm-up of 2 steps from 0 (the first step already above it), then 4 steps down to 0 at the last
    assert create_lr_schedule(6, 1.0, "linear", warmup_steps=2) == pytest.approx([0.5, 1.0, 1.0, 2 / 3, 1 / 3, 0.0])
    assert create_lr_schedule(3, 1.0, "cosine", min_lr=0.2) == pytest.approx([1.0, 0.6, 0.2])
    assert create_lr_schedule(3, 0.5, "constant", warmup_steps=1) == pytest.approx([0.5, 0.5, 0.5])
    assert create_lr_schedule(1, 0.5, "linear") == [0.5] and create_lr_schedule(0, 0.5) == []
    assert (resolve_sft_batch_size(batch_size="auto", default_batch_size=2), resolve_sft_batch_size(
        batch_size=8, default_batch_size=2)) == (2, 8)
    with pytest.raises(art.errors.ConfigError, match="'cosine', 'linear' or 'constant'"):
        create_lr_schedule(3, 1.0, "step")  # type: ignore[arg-type]


def test_dataset_iterator_slices_one_schedule_across_chunks_and_epochs():
    data = [art.Trajectory(messages_and_choices=[{"role": "user", "content": str(i)}]) for i in range(5)]
    chunks = list(create_sft_dataset_iterator(data, chunk_size=2, epochs=2, batch_size=2, peak_lr=1.0,
                                              warmup_ratio=0.0, show_progress=False))
    # 3 batches an epoch (2 + 2 + 1 trajectories), chunks of at most 2 batches: 2 chunks an epoch
    assert [(c.step, c.epoch, c.epoch_step, len(c.trajectories)) for c in chunks] == [
        (0, 0, 0, 4), (2, 0, 2, 1), (3, 1, 0, 4), (5, 1, 2, 1)]
    schedule = create_lr_schedule(6, 1.0, "linear")
    assert [c.config.learning_rate for c in chunks] == [schedule[0:2], schedule[2:3], schedule[3:5], schedule[5:6]]
    assert {c.config.batch_size for c in chunks} == {2}
    # each epoch is its own seeded shuffle of the whole data set (ART's rule: seed + epoch)
    for epoch in range(2):
        order = list(data)
        random.Random(42 + epoch).shuffle(order)
        assert [t for c in chunks if c.epoch == epoch for t in c.trajectories] == order
    # resuming at batch 4 skips initial_step // chunk_size chunks (ART's rule)
    resumed = create_sft_dataset_iterator(data, chunk_size=2, epochs=2, batch_size=2, initial_step=4, show_progress=False)
    assert [c.step for c in resumed] == [3, 5]


def test_iterate_file_streams_rows_through_a_shuffle_buffer(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": str(i)}]}) + "\n\n" for i in range(7)))
    contents = [t.messages_and_choices[0]["content"] for t in iterate_file(str(path), epochs=2, shuffle_buffer_size=3)]
    assert len(contents) == 14 and sorted(contents[:7]) == sorted(contents[7:]) == [str(i) for i in range(7)]
    assert contents[:7] != contents[7:]  # the epochs are shuffled differently
    assert [t.messages_and_choices[0]["content"] for t in iterate_file(str(path), 2, 3, initial_skip=10)] == contents[10:]
    with pytest.raises(art.errors.ConfigError, match="JSONL"):
        next(iterate_file(str(tmp_path / "rows.json")))


async def test_sft_from_file_then_chunks_then_rl(tiny_model_dir, tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Extract the name."},
                          {"role": "user", "content": f"I am person {i}."},
                          {"role": "assistant", "content": f"person {i}"}]} for i in range(3)]
    rows[0]["tools"] = [{"type": "function", "function": {"name": "lookup", "description": "Look a name up",
                                                          "parameters": {"type": "object", "properties": {}}}}]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    backend = LocalBackend(path=str(tmp_path / ".art"))
    model = art.TrainableModel(name="sft-then-rl", project="sft", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        # Phase 1: the file, 2 epochs of 3 rows in batches of 2 -> one step of 3 batches; the cosine
        # schedule ends at 0 on the last, which makes no update (a rate of 0 changes no weight)
        await train_sft_from_file(model=model, file_path=str(data), epochs=2, batch_size=2, peak_lr=1e-3,
                                  schedule_type="cosine", warmup_ratio=0.1, assistant_turns="last")
        assert await model.get_step() == 1
        # Phase 2: teacher outputs as trajectories, one train_sft call per chunk: 2 batches under a
        # linear schedule [1e-3, 0]; the second chunk is the rate-0 batch alone, a step with no update
        demos = [art.Trajectory(messages_and_choices=[*r["messages"][:2], r["messages"][2]]) for r in rows]
        for chunk in create_sft_dataset_iterator(demos, chunk_size=1, batch_size=2, peak_lr=1e-3, show_progress=False):
            await model.train_sft(chunk.trajectories, chunk.config)
        assert await model.get_step() == 3
        # Phase 3: RL picks up from the SFT checkpoints
        client = model.openai_client()

        async def rollout(i: int) -> art.Trajectory:
            messages = [{"role": "user", "content": "Name?"}]
            completion = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=3, seed=i)
            return art.Trajectory(messages_and_choices=[*messages, completion.choices[0]], reward=float(i))

        groups = await art.gather_trajectory_groups([art.TrajectoryGroup(rollout(i) for i in range(3))])
        result = await backend.train(model, groups)
        await model.log(groups, metrics=result.metrics, step=result.step, split="train")
        assert result.step == 4
    finally:
        await backend.close()
    history = art.load_history(tmp_path / ".art" / "sft" / "models" / "sft-then-rl")
    sft = [r for r in history if r["split"] == "sft"]
    assert [(r["step"], r["updates"], r["learning_rate"]) for r in sft] == [(0, 2, 0.0), (1, 1, 1e-3), (2, 0, 0.0)]
