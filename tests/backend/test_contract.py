"""The `Backend` contract, run against every backend (LocalBackend in process, LocalBackend on two gloo
ranks, LocalBackend with its engine as a core in a worker process, RayBackend on a two-node local Ray cluster), through public methods and the real OpenAI client.

One lifecycle per backend: register -> serve the base -> train three steps with data cursors -> the new
adapter is served after each -> retention keeps the latest and the best named by keep_best -> an older
kept step is served again -> a pruned one is refused -> close -> a new backend (a restarted process)
resumes the step, the cursor and the adapter, identically on every rank, and trains on (SFT, GRPO).
"""

from __future__ import annotations

import openai
import pytest
import torch
from backend_helpers import BACKENDS, checkpoint_steps, make_backend, sample_groups
from safetensors.torch import load_file

import groupwise as gw


async def ask_model(model, name):
    r = await model.openai_client().chat.completions.create(
        model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0.0)
    return r.model


@pytest.mark.slow
@pytest.mark.parametrize("kind", BACKENDS)
async def test_backend_contract(kind, tiny_model_dir, tmp_path, request):
    backend = make_backend(kind, tmp_path, request, served_steps=1)
    model = gw.TrainableModel("agent", project="contract", base_model=tiny_model_dir)
    assert isinstance(backend, gw.Backend)
    await model.register(backend)
    try:
        assert model.run_dir == tmp_path / "contract" / "models" / "agent"  # the backend's path holds the run
        assert await model.get_step() == 0
        assert await backend.checkpoint_cursor(model) == {}
        assert await ask_model(model, "agent") == "agent@0"

        config = gw.TrainConfig(learning_rate=1e-2)
        for step in range(3):
            if step == 1:  # as the loop does after validating step 1
                await backend.keep_best(model, 1, metrics_by_step={1: 0.9}, maximize=True)
            groups = await sample_groups(model, step=step)
            result = await model.train(groups, config=config, cursor={"epoch": 0, "offset": 2 * (step + 1)})
            assert result.step == step + 1 and await model.get_step() == step + 1
            assert result.checkpoint_path.endswith(f"{step + 1:04d}")
            assert {"loss", "grad_norm", "trainable_tokens", "step_time"} <= set(result.metrics)
            assert result.metrics["trainable_tokens"] == sum(len(c.token_ids) for g in groups for t in g
                                                             for c in t.choices())
            assert await ask_model(model, "agent") == f"agent@{step + 1}"
            assert await backend.checkpoint_cursor(model) == {"epoch": 0, "offset": 2 * (step + 1)}

        # retention: the latest (3) and the best named by keep_best (1); 2 was neither
        assert checkpoint_steps(model) == [1, 3]
        assert await ask_model(model, "agent@0") == "agent@0"
        with pytest.raises(openai.NotFoundError, match="not served"):
            await ask_model(model, "agent@1")  # served_steps=1: only the latest is loaded
        await backend.serve_step(model, 1)
        assert await ask_model(model, "agent@1") == "agent@1"
        with pytest.raises(gw.GroupwiseError, match="checkpoint of step 2"):
            await backend.serve_step(model, 2)

        states = await backend.rank_states(model)
        assert len(states) == backend.world_size
    finally:
        await backend.close()

    # A restart: a new backend resumes step, cursor, adapter and optimizer from checkpoint 3, on every rank.
    again = make_backend(kind, tmp_path, request)
    clone = gw.TrainableModel("agent", project="contract", base_model=tiny_model_dir)
    await clone.register(again)
    try:
        assert await clone.get_step() == 3
        assert await again.checkpoint_cursor(clone) == {"epoch": 0, "offset": 6}
        assert await ask_model(clone, "agent") == "agent@3"
        saved = load_file(str(clone.store.checkpoints_dir / "0003" / "adapter_model.safetensors"))
        saved_opt = load_file(str(clone.store.checkpoints_dir / "0003" / "optimizer.safetensors"))
        restored = await again.rank_states(clone)
        for rank in restored:
            adapter = {k.replace(".default", ""): v for k, v in rank["adapter"].items()}
            assert adapter.keys() == saved.keys()
            assert all(torch.equal(adapter[k], saved[k]) for k in saved)
            assert rank["optimizer"].keys() == saved_opt.keys()
            assert all(torch.equal(rank["optimizer"][k], saved_opt[k]) for k in saved_opt)
            assert torch.equal(rank["rng"], restored[0]["rng"])
        # it trains on from there: a supervised step (a step like any other; the data cursor stays) ...
        ask = [{"role": "user", "content": "Say the code."}]
        demo = gw.Trajectory(messages_and_choices=[*ask, {"role": "assistant", "content": "zebra"}])
        result = await clone.train_sft([demo] * 6, gw.TrainSFTConfig(learning_rate=[1e-2] * 3, batch_size=2))
        assert (result.step, result.metrics["updates"]) == (4, 3)
        assert result.metrics["last_loss"] < result.metrics["first_loss"]
        assert await ask_model(clone, "agent") == "agent@4"
        assert await again.checkpoint_cursor(clone) == {"epoch": 0, "offset": 6}
        # ... and a GRPO step
        result = await clone.train(await sample_groups(clone, step=4), config=gw.TrainConfig(learning_rate=1e-2))
        assert result.step == 5
    finally:
        await again.close()


@pytest.mark.parametrize("kind", ["local"])
async def test_unregistered_model_is_a_clear_error(kind, tmp_path, request):
    backend = make_backend(kind, tmp_path, request)
    model = gw.TrainableModel("nobody", project="contract", base_model="none", base_path=str(tmp_path))
    with pytest.raises(gw.GroupwiseError, match="not registered"):
        await backend.get_step(model)
    with pytest.raises(gw.GroupwiseError, match="not registered"):
        await backend.checkpoint_cursor(model)
