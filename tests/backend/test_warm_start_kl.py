"""GRPO after a supervised warm start with its KL term anchored at the SFT checkpoint
(TrainConfig.kl_reference_step), through a real LocalBackend: the worker loads that step's adapter,
retention keeps its checkpoint, and a step that names a missing checkpoint fails loudly."""

from __future__ import annotations

import math

import pytest
import torch
from backend_helpers import checkpoint_steps, make_backend, sample_groups
from safetensors.torch import load_file

import groupwise as gw
from groupwise.errors import CheckpointError


@pytest.mark.parametrize("kind", ["local", pytest.param("data_parallel", marks=pytest.mark.slow)])
async def test_grpo_anchored_at_the_sft_step(kind, tiny_model_dir, tmp_path, request):
    """Every backend's ranks train through `Worker.update`, which loads the anchor: in process, and
    on two worker processes (each rank reads the checkpoint and holds the same anchor)."""
    backend = make_backend(kind, tmp_path, request)  # retention on (val/reward; no val rows: the latest)
    model = gw.TrainableModel("agent", project="kl", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        ask = [{"role": "user", "content": "Say the code."}]
        demo = gw.Trajectory(messages_and_choices=[*ask, {"role": "assistant", "content": "zebra"}])
        assert (await model.train_sft([demo] * 4, gw.TrainSFTConfig(learning_rate=1e-2))).step == 1

        config = gw.TrainConfig(learning_rate=1e-2, kl_coef=0.1, kl_reference_step=1)
        first = await model.train(await sample_groups(model, step=1), config=config)
        # The policy still is the SFT adapter: it is its own anchor.
        assert first.step == 2 and first.metrics["kl"] == pytest.approx(0.0, abs=1e-6)
        if kind == "local":  # the anchor the worker loaded is checkpoint 1's adapter, tensor for tensor
            trainer = backend._worker.replicas["kl/agent"].trainer
            saved = load_file(str(model.store.checkpoints_dir / "0001" / "adapter_model.safetensors"))
            held = {k.replace(".default", ""): v for k, v in trainer._reference.items()}
            assert trainer.reference_step == 1 and held.keys() == saved.keys()
            assert all(torch.equal(held[k], saved[k]) for k in saved)

        second = await model.train(await sample_groups(model, step=2), config=config)
        assert second.step == 3 and math.isfinite(second.metrics["kl"]) and second.metrics["kl"] > 1e-6
        rows = [r for r in gw.load_history(model.run_dir) if r["split"] == "train"]
        assert [r["step"] for r in rows] == [1, 2] and rows[-1]["kl"] == second.metrics["kl"]
        assert rows[-1]["kl_reference_step"] == 1
        # Retention keeps the latest (3) and the anchor in use (1); 2 was neither. So does ART's delete.
        assert checkpoint_steps(model) == [1, 3]
        # the prune is in the history: which step went, and what was protected (the anchor in use)
        pruned = [r for r in gw.load_history(model.run_dir) if r["split"] == "retention"]
        assert [(r["step"], r["deleted"], r["in_use"]) for r in pruned] == [(3, [2], [1])]
        assert "nor in use" in pruned[0]["message"]
        await model.delete_checkpoints()
        assert checkpoint_steps(model) == [1, 3]
    finally:
        await backend.close()

    # A restart: the anchor comes back with checkpoint 3, so the retention a resumed loop runs first
    # (keep_best, before any step names the anchor again) keeps it.
    backend = make_backend(kind, tmp_path, request)
    model = gw.TrainableModel("agent", project="kl", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        await backend.keep_best(model, 3)
        assert checkpoint_steps(model) == [1, 3]

        for missing in (2, 9):  # deleted by retention, never written
            with pytest.raises(CheckpointError, match=rf"kl_reference_step={missing}: there is no checkpoint "
                                                      rf".*{missing:04d} of 'kl/agent' \(kept: \[1, 3\]\)"):
                await model.train(await sample_groups(model, step=3),
                                  config=gw.TrainConfig(kl_coef=0.1, kl_reference_step=missing))
        assert await model.get_step() == 3
        # Back to the base model as the anchor: the SFT and GRPO steps moved the policy from it.
        base = await model.train(await sample_groups(model, step=3), config=gw.TrainConfig(kl_coef=0.1))
        assert base.metrics["kl"] > 1e-6
    finally:
        await backend.close()
