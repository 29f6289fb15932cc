"""Joint updates (training/joint.py): several runs' GRPO steps in one forward and backward over the base
they share give each run the update its own step gives."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from groupwise.config import TrainConfig
from groupwise.training.joint import JointPart, joint_problem, joint_train_step
from groupwise.training.trainer import Trainer

from gw_train_helpers import lora_model, random_batch

RUNS = ("run0", "run1", "run2")


def three_runs(tokenizer, dtype=None):
    """A tiny model holding three runs' adapters, each with its own random B (so gradients differ)."""
    model = lora_model(tokenizer, dtype=dtype)
    gen = torch.Generator().manual_seed(7)
    for name in RUNS:
        model.add_adapter(name, model.peft_config["default"])
        with torch.no_grad():
            for n, p in model.named_parameters():
                if f".{name}." in n:
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
    return model


def adapter(model, name):
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{name}." in n}


# Each run its own batch (other lengths, other advantages), rate and objective settings.
BATCHES = [random_batch((20, 18, 16, 14), seed=2), random_batch((9, 25, 12), seed=3),
           random_batch((30, 11, 15, 17, 8), seed=4)]
CONFIGS = [TrainConfig(learning_rate=1e-3, max_seq_len=64),
           TrainConfig(learning_rate=3e-3, max_seq_len=64, loss="cispo", max_grad_norm=0.01),
           TrainConfig(learning_rate=2e-3, max_seq_len=64, normalize="sequence", epsilon_high=0.4)]


@pytest.mark.parametrize("micro_batch_tokens", [4096, 40])
def test_a_joint_step_gives_each_run_its_own_steps_update(tokenizer, micro_batch_tokens):
    """Three runs with their own batches and settings (rate, CISPO, clipping, per-sequence normalisation),
    trained twice: one after the other with `train_step`, and jointly. Each run's adapter, optimizer moments
    and metrics agree to fp64 rounding, also when the token budget splits the joint pass into micro-batches
    that mix runs unevenly; every other adapter is untouched."""
    alone, joint = three_runs(tokenizer), three_runs(tokenizer)
    configs = [dataclasses.replace(c, micro_batch_tokens=micro_batch_tokens) for c in CONFIGS]
    before = adapter(joint, "default")
    expected = []
    for name, batch, config in zip(RUNS, BATCHES, configs):
        expected.append(Trainer(alone, adapter_name=name).train_step(batch, config, step=3))
    trainers = [Trainer(joint, adapter_name=name) for name in RUNS]
    parts = [JointPart(t, b, c) for t, b, c in zip(trainers, BATCHES, configs)]
    assert all(joint_problem(p) is None for p in parts)
    results = joint_train_step(parts, step=3)
    for name, want, got, trainer in zip(RUNS, expected, results, trainers):
        assert isinstance(got, dict), got
        a, b = adapter(alone, name), adapter(joint, name)
        moved = max(float((b[n] - before_n).abs().max()) for n, before_n in adapter(three_runs(tokenizer), name).items())
        assert moved > 1e-5  # the step did move this adapter
        for n in a:
            torch.testing.assert_close(b[n], a[n], rtol=0, atol=1e-12)
        for key in ("loss", "policy_loss", "grad_norm", "clip_fraction", "ratio_mean", "trainable_tokens", "sequences"):
            assert math.isclose(got[key], want[key], rel_tol=1e-9, abs_tol=1e-12), (name, key, got[key], want[key])
        assert got["joint_runs"] == 3.0
        state = trainer.optimizer.state
        assert state and all(int(s["step"]) == 1 for s in state.values())
    for n, v in adapter(joint, "default").items():
        assert torch.equal(v, before[n])  # an adapter of no part is untouched
    if micro_batch_tokens == 40:
        assert results[0]["micro_batches"] >= 2


def test_a_run_whose_gradient_is_not_finite_fails_alone(tokenizer):
    """One run's loss is nan (a sequence's advantage is nan): its error comes back in its place, its adapter is
    as before, and the other runs, whose rows shared the pass, get their updates (the nan stays in its rows)."""
    model = three_runs(tokenizer)
    bad = random_batch((20, 18), seed=5)
    bad.sequences[0].advantage = float("nan")
    batches = [BATCHES[0], bad, BATCHES[2]]
    before = {name: adapter(model, name) for name in RUNS}
    trainers = [Trainer(model, adapter_name=name) for name in RUNS]
    results = joint_train_step([JointPart(t, b, CONFIGS[0]) for t, b in zip(trainers, batches)], step=0)
    from groupwise.errors import NonFiniteError

    assert isinstance(results[1], NonFiniteError), results[1]
    assert all(torch.equal(v, before["run1"][n]) for n, v in adapter(model, "run1").items())
    for k in (0, 2):
        assert isinstance(results[k], dict)
        after = adapter(model, RUNS[k])
        assert all(torch.isfinite(v).all() for v in after.values())
        assert any(not torch.equal(v, before[RUNS[k]][n]) for n, v in after.items())


def test_what_cannot_join_says_why(tokenizer):
    model = lora_model(tokenizer, dropout=0.1)
    t = Trainer(model)
    batch = BATCHES[0]
    assert "dropout" in joint_problem(JointPart(t, batch, CONFIGS[0]))
    t = Trainer(lora_model(tokenizer))
    assert "KL" in joint_problem(JointPart(t, batch, TrainConfig(kl_coef=0.1)))
    assert "num_iterations" in joint_problem(JointPart(t, batch, TrainConfig(num_iterations=2)))
    assert "compiled" in joint_problem(JointPart(t, batch, TrainConfig(compile=True)))
    assert "sft" in joint_problem(JointPart(t, batch, CONFIGS[0]), objective="sft")


def test_the_joint_plan_packs_whole_micro_batches_of_runs_within_the_budget(tokenizer):
    """Each run's micro-batches as it would train alone stay whole (no run's rows span more micro-batches than
    alone); small ones of several runs share a micro-batch; none exceeds the token budget."""
    from groupwise.training.joint import joint_plan

    model = three_runs(tokenizer)
    trainers = [Trainer(model, adapter_name=name) for name in RUNS]
    for budget in (40, 64, 120, 4096):
        config = TrainConfig(micro_batch_tokens=budget, max_seq_len=64)
        parts = [JointPart(t, b, config) for t, b in zip(trainers, BATCHES)]
        alone = [t.admit(b.sequences, config) for t, b in zip(trainers, BATCHES)]
        joint = joint_plan(parts)
        plan = joint.micro_batches
        for k, part in enumerate(parts):
            rows = sorted(i for mb in plan for run, i in mb if run == k)
            assert rows == list(range(len(part.batch.sequences)))  # every row once
            assert sum(1 for mb in plan if any(run == k for run, _ in mb)) <= len(alone[k])
            for own in alone[k]:  # each of its own micro-batches whole in one joint micro-batch
                assert sum(1 for mb in plan if set(own) <= {i for run, i in mb if run == k}) == 1
        for mb in plan:
            widest = max(len(parts[k].batch.sequences[i]) for k, i in mb)
            assert len(mb) * widest <= max(budget, widest)  # a row longer than the budget goes alone
            assert mb == sorted(mb)  # each run's rows together
        assert len(plan) <= sum(len(a) for a in alone)
        assert joint.own == sum(len(a) for a in alone)
        assert joint.worth == (2 * len(plan) <= sum(len(a) for a in alone))
        if budget == 4096:
            assert len(plan) == 1 and joint.worth  # the three small steps in one pass
        if budget == 120:
            assert len(plan) < sum(len(a) for a in alone)  # some packed


def test_a_model_whose_adapted_layer_sees_no_rows_fails_the_pass_before_any_update(tokenizer):
    """An adapter on the LM head, which reads the trained positions flattened ([N, H]): the joint pass cannot
    tell the runs' rows apart, raises `JointLayoutError` (the worker then trains each update alone), and
    no adapter or optimizer has moved."""
    from groupwise.config import LoraConfig
    from groupwise.runtime.loading import tiny_random_model
    from groupwise.training.adapters import wrap_with_lora
    from groupwise.training.lora_forward import JointLayoutError

    model, _ = tiny_random_model(seed=0, tokenizer=tokenizer, dtype=torch.float64)
    model = wrap_with_lora(model, LoraConfig(rank=4, alpha=8, target_modules=("q_proj", "lm_head")))
    model.add_adapter("run1", model.peft_config["default"])
    assert any("lm_head" in n and "lora_A" in n for n, _ in model.named_parameters())
    trainers = [Trainer(model), Trainer(model, adapter_name="run1")]
    before = [adapter(model, name) for name in ("default", "run1")]
    with pytest.raises(JointLayoutError, match="train alone"):
        joint_train_step([JointPart(t, b, CONFIGS[0]) for t, b in zip(trainers, BATCHES)], step=0)
    for name, values in zip(("default", "run1"), before):
        assert all(torch.equal(v, values[n]) for n, v in adapter(model, name).items())
    assert all(p.grad is None for t in trainers for _, p in t.trainable_named_parameters())


def test_a_half_precision_base_trains_jointly_as_alone_to_bf16_rounding(tokenizer):
    """A bf16 base (the GPU's dtype; autocast on the CPU here): the joint pass's adapters, fp32 master weights,
    agree with the runs' own steps to bf16 rounding of their updates."""
    alone, joint = three_runs(tokenizer, dtype=torch.bfloat16), three_runs(tokenizer, dtype=torch.bfloat16)
    start = {name: adapter(alone, name) for name in RUNS}
    for name, batch, config in zip(RUNS, BATCHES, CONFIGS):
        Trainer(alone, adapter_name=name).train_step(batch, config, step=0)
    results = joint_train_step([JointPart(Trainer(joint, adapter_name=n), b, c)
                                for n, b, c in zip(RUNS, BATCHES, CONFIGS)], step=0)
    assert all(isinstance(r, dict) for r in results)
    for name in RUNS:
        a, b = adapter(alone, name), adapter(joint, name)
        assert all(v.dtype == torch.float32 for v in b.values())
        step = max(float((a[n] - start[name][n]).abs().max()) for n in a)
        diff = max(float((a[n] - b[n]).abs().max()) for n in a)
        assert step > 0 and diff <= 0.05 * step, (name, diff, step)
