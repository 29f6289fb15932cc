"""The trainer: exact gradient accumulation, chunked log-probs, a step that moves the adapter, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch
from gw_train_helpers import lora_model, random_batch

from groupwise.config import LoraConfig, TrainConfig
from groupwise.training.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    optimizer_to_tensors,
    prune_checkpoints,
    save_checkpoint,
)
from groupwise.training.logprobs import token_logprobs
from groupwise.training.adapters import wrap_with_lora
from groupwise.runtime.loading import tiny_random_model
from groupwise.training.trainer import Trainer, plan_micro_batches


def test_plan_micro_batches_respects_the_token_budget():
    # longest first; a batch of n sequences costs n * (its longest) padded tokens
    assert plan_micro_batches([5, 10, 3, 8], 20) == [[1, 3], [0, 2]]  # 2*10=20, 2*5=10
    assert plan_micro_batches([5, 10, 3, 8], 9) == [[1], [3], [0], [2]]  # 10 > 9 still gets its own batch


def test_collate_pads_each_row_after_its_own_tokens_and_trains_only_sampled_ones():
    """The micro-batch's tensors, against building them row by row: ragged rows (one of a single token, one as
    long as the longest), NaN log-probs at context, an int 0/1 mask; pads after each row's tokens only."""
    import random

    from groupwise.training.micro_batches import collate
    from groupwise.training.tokenize import TokenizedSequence

    rng = random.Random(3)
    seqs = []
    for n in [1, 7, 12, 12, 3]:
        mask = [rng.random() < 0.6 for _ in range(n)]
        seqs.append(TokenizedSequence([rng.randrange(1, 50_000) for _ in range(n)], mask if n != 3 else [int(m) for m in mask],
                                      [-rng.random() if m else math.nan for m in mask], advantage=rng.uniform(-1, 1)))
    got = collate(seqs, pad_id=-7, device=torch.device("cpu"))
    B, T = len(seqs), 12
    ids, mask, old = torch.full((B, T), -7), torch.zeros((B, T), dtype=torch.bool), torch.full((B, T), math.nan, dtype=torch.float64)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(s.input_ids)
        mask[b, :len(s)] = torch.tensor(s.mask, dtype=torch.bool)
        old[b, :len(s)] = torch.tensor(s.old_logprobs, dtype=torch.float64)
    mask[:, 0] = False
    assert torch.equal(got["input_ids_BT"], ids) and got["input_ids_BT"].dtype == torch.long
    assert torch.equal(got["mask_BT"], mask)
    assert torch.equal(got["old_logprobs_BT"].isnan(), old.isnan())
    assert torch.equal(got["old_logprobs_BT"].nan_to_num(), old.nan_to_num())
    assert torch.equal(got["target_index_N"], mask.reshape(-1).nonzero().squeeze(1))
    assert got["advantages_B"].tolist() == [s.advantage for s in seqs] and got["attention_BT"] is None


@pytest.mark.parametrize("normalize", ["token", "sequence", "constant"])
def test_four_micro_batches_equal_the_full_batch_fp64(tokenizer, normalize):
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    batch = random_batch()
    grads = []
    for budget in (10_000, 20):  # one micro-batch of 4, then four of 1 (20 < 2 * 18)
        config = TrainConfig(micro_batch_tokens=budget, normalize=normalize, max_seq_len=64, logprob_chunk_size=7)
        for _, p in trainer.trainable_named_parameters():
            p.grad = None
        trainer._activate()
        stats, plan = trainer.forward_backward(batch, config)
        assert len(plan) == (1 if budget == 10_000 else 4)
        grads.append({n: p.grad.clone() for n, p in trainer.trainable_named_parameters()})
    full, split = grads
    scale = max(float(full[n].abs().max()) for n in full)
    assert scale > 1e-6  # the gradient is not trivially zero
    for n in full:
        assert torch.allclose(full[n], split[n], atol=1e-6, rtol=0), n
        # fp64 makes the split exact to rounding, far inside 1e-6 even relative to the gradient's size
        assert float((full[n] - split[n]).abs().max()) <= 1e-9 * scale, n


def test_chunked_logprobs_equal_a_full_log_softmax(tokenizer):
    model = lora_model(tokenizer)
    ids_BT = torch.randint(3, 500, (2, 9), generator=torch.Generator().manual_seed(3))
    attention_BT = torch.ones_like(ids_BT)
    mask_BT = torch.zeros_like(ids_BT, dtype=torch.bool)
    mask_BT[:, 4:] = True
    with torch.no_grad():
        logits_BTV = model(input_ids=ids_BT, attention_mask=attention_BT).logits
        full_BT = logits_BTV[:, :-1].log_softmax(-1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
        chunked_BT = token_logprobs(model, ids_BT, attention_BT, mask_BT, chunk_size=3)
    assert torch.allclose(chunked_BT[:, 4:], full_BT[:, 3:], atol=1e-10)
    assert torch.all(chunked_BT[:, :4] == 0)


def test_step_moves_only_the_adapter_and_checkpoint_round_trips(tokenizer, tmp_path):
    model = lora_model(tokenizer, dtype=torch.float32)
    trainer = Trainer(model)
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in trainer.trainable_named_parameters()}
    config = TrainConfig(learning_rate=1e-3, micro_batch_tokens=40, max_seq_len=64)
    seen = []
    metrics = trainer.train_step(random_batch(), config, step=0, progress=lambda done, total: seen.append((done, total)))
    assert metrics["trainable_tokens"] == 10 + 9 + 8 + 7 and metrics["micro_batches"] == 2
    # progress after each micro-batch, in padded tokens, ending at the step's total
    total = metrics["padded_tokens"]
    assert len(seen) == 2 and seen[0][0] < seen[1][0] == total and {t for _, t in seen} == {total}
    assert metrics["grad_norm"] > 0 and math.isfinite(metrics["loss"])
    moved = [n for n, p in trainer.trainable_named_parameters() if not torch.equal(p, lora_before[n])]
    assert len(moved) == len(lora_before)
    assert all(torch.equal(p, base_before[n]) for n, p in model.named_parameters() if "lora_" not in n)

    names = [n for n, _ in trainer.trainable_named_parameters()]
    path = save_checkpoint(tmp_path, 1, model=model, optimizer=trainer.optimizer, param_names=names,
                           cursor={"epoch": 0, "index": 8}, metrics={"val/reward": 0.5})
    assert path.name == "0001" and (path / "state.json").is_file() and (path / "adapter_model.safetensors").is_file()
    saved_opt, _ = optimizer_to_tensors(trainer.optimizer, names)

    # A fresh process: new model, new trainer, resume from the checkpoint.
    model2 = lora_model(tokenizer, dtype=torch.float32)
    trainer2 = Trainer(model2)
    trainer2.ensure_optimizer(config)
    state = load_checkpoint(latest_checkpoint(tmp_path), model=model2, optimizer=trainer2.optimizer, param_names=names)
    assert state.step == 1 and state.cursor == {"epoch": 0, "index": 8}
    loaded_opt, _ = optimizer_to_tensors(trainer2.optimizer, names)
    assert saved_opt.keys() == loaded_opt.keys() and all(torch.equal(saved_opt[k], loaded_opt[k]) for k in saved_opt)
    for (n, p), (_, q) in zip(trainer.trainable_named_parameters(), trainer2.trainable_named_parameters()):
        assert torch.equal(p, q), n
    # Both take the same next step to the same adapter: the optimizer really resumed.
    trainer.train_step(random_batch(), config, step=1)
    trainer2.train_step(random_batch(), config, step=1)
    for (n, p), (_, q) in zip(trainer.trainable_named_parameters(), trainer2.trainable_named_parameters()):
        assert torch.equal(p, q), n


def test_grpo_after_sft_starts_with_fresh_adam_moments(tokenizer, tmp_path):
    """Adam's moments belong to the objective they were estimated on: the first GRPO step after SFT moves
    the adapter exactly as an optimizer without history would, also after a restart from the SFT
    checkpoint; SFT after SFT keeps its moments."""
    config = TrainConfig(learning_rate=1e-3, micro_batch_tokens=40, max_seq_len=64)
    warm_model = lora_model(tokenizer, dtype=torch.float32)
    warm = Trainer(warm_model)
    for step in range(2):
        warm.train_step(random_batch(), config, step=step, objective="sft")
    assert {float(s["step"]) for s in warm.optimizer.state.values()} == {2.0}
    names = [n for n, _ in warm.trainable_named_parameters()]
    save_checkpoint(tmp_path, 2, model=warm_model, optimizer=warm.optimizer, param_names=names)

    fresh = Trainer(lora_model(tokenizer, dtype=torch.float32))
    with torch.no_grad():
        for (_, p), (_, q) in zip(fresh.trainable_named_parameters(), warm.trainable_named_parameters()):
            p.copy_(q)
    resumed_model = lora_model(tokenizer, dtype=torch.float32)
    resumed = Trainer(resumed_model)
    resumed.ensure_optimizer(config)
    load_checkpoint(latest_checkpoint(tmp_path), model=resumed_model, optimizer=resumed.optimizer, param_names=names)
    assert {float(s["step"]) for s in resumed.optimizer.state.values()} == {2.0}

    for trainer in (warm, fresh, resumed):
        trainer.train_step(random_batch(), config, step=2, objective="grpo")
    assert {float(s["step"]) for s in warm.optimizer.state.values()} == {1.0}
    for (n, p), (_, q), (_, r) in zip(fresh.trainable_named_parameters(), warm.trainable_named_parameters(),
                                      resumed.trainable_named_parameters()):
        assert torch.equal(p, q) and torch.equal(p, r), n


def test_incomplete_checkpoints_are_ignored_and_retention(tokenizer, tmp_path):
    model = lora_model(tokenizer, dtype=torch.float32)
    names = [n for n, _ in Trainer(model).trainable_named_parameters()]
    for step, reward in [(1, 0.2), (2, 0.9), (3, 0.4), (4, 0.1)]:
        save_checkpoint(tmp_path, step, model=model, optimizer=None, param_names=names, metrics={"val/reward": reward})
    (tmp_path / "0005").mkdir()  # killed before state.json: incomplete
    (tmp_path / "0005" / "adapter_model.safetensors").write_bytes(b"partial")
    with pytest.warns(UserWarning, match="incomplete"):
        assert latest_checkpoint(tmp_path).step == 4
    # keep the latest (4) and the best by val/reward (2)
    assert prune_checkpoints(tmp_path, best_metric="val/reward") == [1, 3]
    assert [s.step for s in list_checkpoints(tmp_path, warn=False)] == [2, 4]


def test_kl_against_the_base_model_with_the_adapter_disabled(tokenizer):
    from groupwise.runtime.loading import tiny_random_model

    # A fresh adapter (B = 0) IS the base model: k3 KL is exactly 0 on every token.
    fresh, _ = tiny_random_model(seed=0, tokenizer=tokenizer)
    trainer = Trainer(wrap_with_lora(fresh, LoraConfig(rank=4, alpha=8)))
    config = TrainConfig(kl_coef=0.1, micro_batch_tokens=40, max_seq_len=64)
    assert trainer.train_step(random_batch(), config, step=0)["kl"] == 0.0
    # An adapter that moved the policy: KL > 0, and it adds to the loss (kl_coef * mean KL for token norm).
    moved = Trainer(lora_model(tokenizer, dtype=torch.float64))
    with_kl = moved.train_step(random_batch(), TrainConfig(kl_coef=0.1, max_seq_len=64, learning_rate=1e-12), step=0)
    without = moved.train_step(random_batch(), TrainConfig(kl_coef=0.0, max_seq_len=64, learning_rate=1e-12), step=0)
    assert with_kl["kl"] > 0
    assert with_kl["loss"] - without["loss"] == pytest.approx(0.1 * with_kl["kl"], rel=1e-6)


def test_layer_checkpointing_gives_the_same_gradient_fp64(tokenizer):
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    grads = []
    for on in (False, True):
        for _, p in trainer.trainable_named_parameters():
            p.grad = None
        trainer._activate()
        trainer._set_layer_checkpointing(on)
        model.train()
        trainer.forward_backward(random_batch(), TrainConfig(max_seq_len=64, gradient_checkpointing=on))
        trainer._set_layer_checkpointing(False)
        grads.append({n: p.grad.clone() for n, p in trainer.trainable_named_parameters()})
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-12) for n in grads[0])
    assert not model.get_base_model().is_gradient_checkpointing  # left off for the engine


def test_bf16_base_trains_an_fp32_adapter_under_autocast(tokenizer):
    """A bf16 base keeps fp32 LoRA weights; the step runs the adapter's matmuls in bf16 (autocast)
    and its gradient stays close to the fp32 model's (same weights, same batch)."""
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = lora_model(tokenizer, dtype=torch.float32)
        if dtype == torch.bfloat16:
            for n, p in model.named_parameters():
                if "lora_" not in n:
                    p.data = p.data.to(torch.bfloat16)
        trainer = Trainer(model)
        assert trainer._base_dtype == dtype
        trainer._activate()
        stats, _ = trainer.forward_backward(random_batch(), TrainConfig(micro_batch_tokens=10_000, max_seq_len=64))
        named = trainer.trainable_named_parameters()
        assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for _, p in named)
        grads[dtype] = torch.cat([p.grad.flatten() for _, p in named])
    g32, g16 = grads[torch.float32], grads[torch.bfloat16]
    cosine = float(torch.nn.functional.cosine_similarity(g32, g16, dim=0))
    assert cosine > 0.99, cosine  # bf16 activations: a close, not equal, gradient


def test_compiled_layers_give_the_eager_gradient_and_are_removed_after(tokenizer):
    """TrainConfig(compile=True) (the CUDA default) on CPU: the same gradient as eager, and the
    engine's layers are eager again after the step (it captures CUDA graphs of those)."""
    grads = []
    for compile_layers in (False, True):
        model = lora_model(tokenizer, dtype=torch.float32)
        trainer = Trainer(model)
        trainer._activate()
        trainer.forward_backward(random_batch(), TrainConfig(max_seq_len=64, compile=compile_layers))
        assert bool(trainer._compiled) == compile_layers
        layers = model.get_base_model().model.layers
        assert not any("forward" in layer.__dict__ for layer in layers)
        grads.append(torch.cat([p.grad.flatten() for _, p in trainer.trainable_named_parameters()]))
    eager, compiled = grads
    assert float(eager.abs().max()) > 1e-5
    # fp32, fused kernels add in another order: equal to ~1e-6 of the gradient's size
    assert torch.allclose(compiled, eager, atol=1e-6 * float(eager.abs().max()), rtol=0)


def test_mis_through_the_trainer_drops_the_tokens_a_stale_sampler_made_unlikely(tokenizer):
    # Sequences 0 and 1 were sampled by a policy that gave their tokens logprob -50 (w = pi / mu is huge),
    # 2 and 3 by the trainer's own policy (NaN: w = 1). MIS drops 0 and 1's tokens: the gradient is that of
    # the uncorrected loss with their advantages set to 0 (the token normaliser still counts them).
    import dataclasses as dc

    model = lora_model(tokenizer, dtype=torch.float64)
    trainer = Trainer(model)
    stale = random_batch()
    stale.sequences = [dc.replace(s, old_logprobs=[-50.0 if m else math.nan for m in s.mask]) if b < 2
                       else dc.replace(s, old_logprobs=[math.nan] * len(s)) for b, s in enumerate(stale.sequences)]
    zeroed = random_batch()
    zeroed.sequences = [dc.replace(s, old_logprobs=[math.nan] * len(s), advantage=0.0 if b < 2 else s.advantage)
                        for b, s in enumerate(zeroed.sequences)]
    grads, stats = [], []
    for batch, mode in ((stale, "mis"), (zeroed, "none")):
        for _, p in trainer.trainable_named_parameters():
            p.grad = None
        trainer._activate()
        s, _ = trainer.forward_backward(batch, TrainConfig(off_policy=mode, max_seq_len=64))
        stats.append(s)
        grads.append({n: p.grad.clone() for n, p in trainer.trainable_named_parameters()})
    assert max(float(g.abs().max()) for g in grads[1].values()) > 1e-8
    for n in grads[0]:
        assert torch.allclose(grads[0][n], grads[1][n], atol=1e-12, rtol=0), n
    sampled = [sum(s.mask) for s in stale.sequences]  # [10, 9, 8, 7]
    assert stats[0].capped_tokens == sampled[0] + sampled[1] and stats[1].capped_tokens == 0
    metrics = trainer.train_step(stale, TrainConfig(off_policy="tis", max_seq_len=64, learning_rate=1e-12), step=0)
    assert metrics["importance_capped_fraction"] == pytest.approx(19 / 34)


def test_taking_its_adapter_back_leaves_the_model_as_pefts_set_adapter_does(tokenizer):
    """The trainer's own switch to its adapter (training.adapters.set_active_adapter, no walk over every
    module) leaves every flag peft's `set_adapter` leaves: the active adapter of the model, its tuner and
    each layer, and which parameters train."""
    def state(model):
        from peft.tuners.tuners_utils import BaseTunerLayer

        return (model.active_adapter, model.base_model.active_adapter,
                [(m.active_adapters, m.disable_adapters) for m in model.modules() if isinstance(m, BaseTunerLayer)],
                [(n, p.requires_grad) for n, p in model.named_parameters()])

    models = []
    for _ in range(2):
        model = lora_model(tokenizer)
        for extra in ("run1", "run2"):
            model.add_adapter(extra, model.peft_config["default"])
        model.set_adapter("run2")  # the engine served another adapter meanwhile
        models.append(model)
    trainer = Trainer(models[0], adapter_name="run1")
    trainer._activate()
    models[1].set_adapter("run1")
    assert state(models[0]) == state(models[1])
    assert state(models[0])[0] == "run1" and any(g for n, g in state(models[0])[3] if ".run1." in n)


def test_switching_between_runs_adapters_leaves_what_pefts_set_adapter_leaves(tokenizer):
    """Trainers of several runs on one base take turns (the switch writes only the flags that differ, from
    a list of every adapter's parameters kept with the module walk): after each turn, and after an adapter
    is added between turns (a new walk, so a new list), the model's flags are peft's own, also where a
    parameter of an inactive adapter had been left trainable."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    def state(model):
        return (model.active_adapter, model.base_model.active_adapter,
                [(m.active_adapters, m.disable_adapters) for m in model.modules() if isinstance(m, BaseTunerLayer)],
                [(n, p.requires_grad) for n, p in model.named_parameters()])

    import copy

    ours, pefts = lora_model(tokenizer), lora_model(tokenizer)
    for model in (ours, pefts):
        for extra in ("run1", "run2"):
            model.add_adapter(extra, model.peft_config["default"])
        # a served adapter of another kind on the same base (DoRA: a magnitude vector per layer), never trained here
        dora = copy.deepcopy(model.peft_config["default"])
        dora.use_dora = True
        model.add_adapter("dora", dora)
    assert any("lora_magnitude_vector.dora" in n for n, _ in ours.named_parameters())
    trainers = {name: Trainer(ours, adapter_name=name) for name in ("default", "run1", "run2")}
    turns = ["run1", "run2", "default", "run2", "run1", "run3", "run1", "default"]
    for i, name in enumerate(turns):
        if name == "run3":  # a run registers between turns: every trainer's walk and list are new
            for model in (ours, pefts):
                model.add_adapter("run3", model.peft_config["default"])
            trainers["run3"] = Trainer(ours, adapter_name="run3")
        if i == 3:  # someone left an inactive adapter's weight trainable; the next switch puts it back
            stray = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.run1.weight"
            for model in (ours, pefts):
                dict(model.named_parameters())[stray].requires_grad_(True)
        trainers[name]._activate()
        pefts.set_adapter(name)
        assert state(ours) == state(pefts), (i, name)
        trained = {n for n, p in ours.named_parameters() if p.requires_grad}
        assert trained and all(f".{name}." in n for n in trained), (name, sorted(trained)[:3])


def test_an_update_runs_every_module_it_calls_in_train_mode_and_no_other_adapters(tokenizer):
    """The trainer's train/eval switch skips the base's other adapters' modules (peft's per-adapter
    dicts): every module the update's passes call is in train mode (its adapter's dropout included),
    none of another adapter's modules is called or switched, and all are in eval mode after the step."""
    model = lora_model(tokenizer, dropout=0.1)
    for extra in ("run1", "run2"):
        model.add_adapter(extra, model.peft_config["default"])
    model.eval()
    trainer = Trainer(model, adapter_name="run1")
    names = {m: n for n, m in model.named_modules()}
    called, switched = {}, set()

    def record(module, args):
        called.setdefault(names[module], module.training)

    hooks = [m.register_forward_pre_hook(record) for m in model.modules()]
    original = Trainer._set_mode

    def spy(self, training):
        original(self, training)
        switched.update(names[m] for m in model.modules() if m.training)

    try:
        Trainer._set_mode = spy
        trainer.train_step(random_batch(), TrainConfig(learning_rate=1e-3, max_seq_len=64), step=0)
    finally:
        Trainer._set_mode = original
        for h in hooks:
            h.remove()
    assert called and all(called.values()), [n for n, t in called.items() if not t][:3]
    assert any(".lora_dropout.run1" in n for n in called)
    for other in (".default", ".run2"):
        assert not any(other in n for n in called) and not any(other in n for n in switched), other
    assert not any(m.training for m in model.modules())


def test_num_iterations_takes_that_many_optimizer_steps_on_one_batch(tokenizer):
    """GRPO's mu: a step with num_iterations=2 is two optimizer steps on the same rollouts, exactly two
    steps of 1 on that batch, and reports the first's loss (the objective at the sampling policy). From
    peft's own start (B = 0) the first update moves only B; the second is what moves A."""
    one, two = (TrainConfig(learning_rate=1e-3, micro_batch_tokens=40, max_seq_len=64, num_iterations=n) for n in (1, 2))
    twice, mu = Trainer(lora_model(tokenizer)), Trainer(lora_model(tokenizer))
    first = twice.train_step(random_batch(), one, step=0)
    twice.train_step(random_batch(), one, step=1)
    seen = []
    metrics = mu.train_step(random_batch(), two, step=0, progress=lambda done, total: seen.append((done, total)))
    for (n, p), (_, q) in zip(twice.trainable_named_parameters(), mu.trainable_named_parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-12), n
    assert metrics["loss"] == first["loss"] and metrics["grad_norm"] == first["grad_norm"]
    assert {float(s["step"]) for s in mu.optimizer.state.values()} == {2.0}
    # the progress bar runs once over both updates
    assert [t for _, t in seen] == [2 * metrics["padded_tokens"]] * 4 and seen[-1][0] == 2 * metrics["padded_tokens"]

    for n_updates, a_moves in ((1, False), (2, True)):
        base, _ = tiny_random_model(seed=0, tokenizer=tokenizer, dtype=torch.float64)
        model = wrap_with_lora(base, LoraConfig(rank=4, alpha=8))  # peft's start: B = 0
        trainer = Trainer(model)
        a_before = {n: p.detach().clone() for n, p in trainer.trainable_named_parameters() if "lora_A" in n}
        trainer.train_step(random_batch(), TrainConfig(learning_rate=1e-3, micro_batch_tokens=40, max_seq_len=64,
                                                 num_iterations=n_updates), step=0)
        moved = [n for n, p in trainer.trainable_named_parameters() if n in a_before and not torch.equal(p, a_before[n])]
        assert bool(moved) is a_moves and (not a_moves or len(moved) == len(a_before))


def test_num_iterations_needs_one_step_per_batch_off_policy():
    """The decoupled ratio (off_policy) is taken against the policy at the step's start: one update only."""
    from groupwise.errors import ConfigError

    with pytest.raises(ConfigError, match="num_iterations=2 with off_policy='tis'"):
        TrainConfig(num_iterations=2, off_policy="tis")
    with pytest.raises(ConfigError, match="num_iterations"):
        TrainConfig(num_iterations=0)
