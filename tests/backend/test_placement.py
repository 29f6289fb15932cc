"""Placement (`BackendOptions.train_workers`): one worker process only trains, the other only generates.
After each step (GRPO or SFT) the generator serves the trainer's adapter bit for bit (loaded from rank
0's checkpoint), rollouts reach the generator alone, the run equals the one-process run on the same
batches, and a generator resumes the last checkpoint. Bad placements fail at construction, saying what
to change."""

from __future__ import annotations

import pytest
import torch
from backend_helpers import sample_groups

import groupwise as gw
from groupwise.backend.ray import RayBackend
from groupwise.backend.worker import DeviceWorker, ModelSpec, WorkerOptions
from groupwise.errors import ConfigError, GroupwiseError


async def _greedy_logprobs(model) -> list[float]:
    """The logprobs of a fixed greedy answer through the model's own client (the router)."""
    r = await model.openai_client().chat.completions.create(
        model=model.inference_name(), messages=[{"role": "user", "content": "scenario 0"}], max_tokens=4,
        temperature=0.0, logprobs=True)
    return [t.logprob for t in r.choices[0].logprobs.content]


@pytest.mark.slow
async def test_a_generator_serves_each_trained_adapter_and_the_run_equals_one_process(tiny_model_dir, tmp_path):
    config = gw.TrainConfig(learning_rate=5e-2)
    backend = gw.LocalBackend(path=str(tmp_path / "split"), devices=["cpu", "cpu"], train_workers=1,
                              collective_timeout_s=60, best_checkpoint_metric=None)
    model = gw.TrainableModel("split", project="pl", base_model=tiny_model_dir)
    await model.register(backend)
    batches, served, trained, logprobs = [], [], [], []
    try:
        assert (backend.train_ranks, backend.generator_ranks) == ([0], [1])
        # the router knows the generator only: rank 0 (the trainer) serves no rollout
        router = model.openai_client()._client._transport  # the httpx transport of the model's one client
        generator_url = backend.http_endpoint(model).base_url
        assert [str(u) for u in router.urls] == [generator_url]
        logprobs.append(await _greedy_logprobs(model))
        for step in range(2):
            groups = await sample_groups(model, n_groups=2, step=step, max_tokens=6)
            batches.append(groups)
            result = await model.train(groups, config=config)
            assert result.step == step + 1
            [state] = await backend.rank_states(model)  # the trainer's adapter
            trained.append(state["adapter"])
            served.append(await backend.served_adapters(model, result.step))  # what each engine serves as @k
            logprobs.append(await _greedy_logprobs(model))
        # a supervised step takes the same way to the generator
        sft = await model.train_sft([t for g in batches[0] for t in g], gw.TrainSFTConfig(learning_rate=5e-2))
        [state] = await backend.rank_states(model)
        trained.append(state["adapter"])
        served.append(await backend.served_adapters(model, sft.step))
        assert await backend.served_steps(model) == [0, 2, 3]  # served_steps=2 keeps the last two
        sent = sum(router.sent)
    finally:
        await backend.close()

    assert sent == 3 + 2 * 2 * 4  # every request (3 greedy, 2 steps x 2 groups x 4 rollouts) went to the generator
    for adapter, by_rank in zip(trained, served):
        assert len(adapter) > 0
        for tensors in by_rank:  # the trainer's own engine and the generator serve the trained bits
            assert tensors.keys() == adapter.keys()
            assert all(torch.equal(tensors[k], adapter[k]) for k in adapter)
    assert len(trained) == 3
    for before, after in zip(trained, trained[1:]):  # every step moved the adapter
        assert not all(torch.equal(before[k], after[k]) for k in before)
    # the served policy changed after each step: the same greedy request answers with other logprobs
    assert logprobs[0] != pytest.approx(logprobs[1], abs=1e-6)
    assert logprobs[1] != pytest.approx(logprobs[2], abs=1e-6)

    # The same batches trained by one process (one trainer, as the placement has): bitwise the same
    # adapter and loss. One trainer sums the same sequences in the same order; only data-parallel
    # trainers (devices=[cpu, cpu] without train_workers) reorder the sum (test_data_parallel.py).
    single = gw.LocalBackend(path=str(tmp_path / "single"), device="cpu", best_checkpoint_metric=None)
    one = gw.TrainableModel("split", project="pl", base_model=tiny_model_dir)
    await one.register(single)
    try:
        for groups in batches:
            await one.train(groups, config=config)
        await one.train_sft([t for g in batches[0] for t in g], gw.TrainSFTConfig(learning_rate=5e-2))
        [reference] = await single.rank_states(one)
    finally:
        await single.close()
    assert all(torch.equal(reference["adapter"][k], trained[-1][k]) for k in reference["adapter"])
    losses = [[(r["split"], r["loss"]) for r in m.store.history() if r.get("split") in ("train", "sft")]
              for m in (model, one)]
    assert losses[0] == losses[1] and len(losses[0]) == 3

    # A generator resuming the run (a new backend over the same folder) serves its last checkpoint and
    # holds no trainer: the worker of rank 1, here in this process.
    generator = DeviceWorker(1, 2, "cpu", WorkerOptions(dtype=None, max_batch_size=4, engine_kwargs={}, verify_adapter=True, joint_updates=True,
                                                  load_model=None, memory_budget_gb=None, train_workers=1))
    try:
        info = await generator.load(ModelSpec("split", tiny_model_dir, gw.LoraConfig(), str(model.store.checkpoints_dir)))
        assert (info["step"], info["fingerprint"], generator.replicas["split"].trainer) == (3, None, None)
        resumed = await generator.served_tensors("split", 3)
    finally:
        await generator.close()
    assert all(torch.equal(resumed[k], trained[-1][k]) for k in trained[-1])


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"devices": ["cpu", "cpu"], "train_workers": 2}, r"train_workers=2 with 2 worker\(s\) leaves no generator"),
    ({"devices": 2, "train_workers": 3}, r"train_workers=3 with 2 worker\(s\) leaves no generator.*<= 1"),
    ({"devices": ["cpu", "cpu"], "train_workers": 0}, r"train_workers=0 leaves no trainer"),
    ({"device": "cpu", "train_workers": 1}, r"runs one device in process: pass devices"),
    ({"train_workers": 1}, r"runs one device in process"),
    ({"devices": 4, "train_workers": 1.5}, r"train_workers"),
])
def test_bad_placements_fail_at_construction_saying_what_to_do(kwargs, message):
    with pytest.raises(ConfigError, match=message) as caught:
        gw.LocalBackend(**kwargs)
    assert isinstance(caught.value, GroupwiseError)


def test_ray_placements_are_checked_against_num_workers():
    with pytest.raises(ConfigError, match=r"train_workers=2 with 2 worker\(s\) leaves no generator.*num_workers"):
        RayBackend(num_workers=2, use_gpu=False, train_workers=2)
    with pytest.raises(ConfigError, match=r"train_workers=1 with 1 worker\(s\)"):
        RayBackend(train_workers=1)
    backend = RayBackend(num_workers=4, use_gpu=False, train_workers=1)  # nothing starts before register
    assert (backend.train_ranks, backend.generator_ranks) == ([0], [1, 2, 3])


def test_without_a_placement_every_rank_trains_and_generates():
    backend = gw.LocalBackend(devices=["cpu", "cpu", "cpu"])
    assert (backend.train_ranks, backend.generator_ranks) == ([0, 1, 2], [])
    backend = gw.LocalBackend(devices=["cpu", "cpu", "cpu"], options=gw.BackendOptions(train_workers=2))
    assert (backend.train_ranks, backend.generator_ranks) == ([0, 1], [2])


def test_a_generator_serving_other_bits_than_rank_0_is_a_loud_error():
    from groupwise.backend.driver import ReplicaDivergenceError
    from groupwise.backend.protocol import Published
    from groupwise.backend.ranks import check_served

    same = [Published(r, served_fingerprint=[3, 5]) for r in range(3)]
    check_served("m", 2, same)
    with pytest.raises(ReplicaDivergenceError, match=r"after step 2 of 'm' the engines of rank\(s\) \[2\] serve another"):
        check_served("m", 2, [*same[:2], Published(2, served_fingerprint=[3, 6])])
