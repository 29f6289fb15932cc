"""The KL term anchored at a checkpoint's adapter (TrainConfig.kl_reference_step): the reference pass is
the model holding those weights, the policy pass sees its own weights again, the base anchor is as before."""

from __future__ import annotations

import math

import pytest
import torch
from gw_train_helpers import lora_model, random_batch

from groupwise.config import TrainConfig
from groupwise.errors import ConfigError
from groupwise.training import trainer as trainer_module
from groupwise.training.checkpoint import adapter_tensors, latest_checkpoint, prune_checkpoints, save_checkpoint
from groupwise.training.logprobs import token_logprobs
from groupwise.training.loss import grpo_loss
from groupwise.training.tokenize import TokenizedBatch
from groupwise.training.trainer import Trainer


LENGTHS = (20, 18, 16, 14)


def _padded(batch: TokenizedBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The batch as one right-padded micro-batch, built here (not by the trainer): ids, mask, old, advantages."""
    T = max(LENGTHS)
    ids_BT = torch.zeros((len(LENGTHS), T), dtype=torch.long)
    mask_BT = torch.zeros((len(LENGTHS), T), dtype=torch.bool)
    old_BT = torch.full((len(LENGTHS), T), math.nan, dtype=torch.float64)
    for b, s in enumerate(batch.sequences):
        ids_BT[b, :len(s)] = torch.tensor(s.input_ids)
        mask_BT[b, 1:len(s)] = torch.tensor(s.mask[1:])
        old_BT[b, :len(s)] = torch.tensor(s.old_logprobs, dtype=torch.float64)
    return ids_BT, mask_BT, old_BT, torch.tensor([s.advantage for s in batch.sequences], dtype=torch.float64)


def _grads(trainer: Trainer, batch: TokenizedBatch, config: TrainConfig):
    """forward_backward in train mode (what train_step runs before the optimizer): stats and gradients."""
    trainer._activate()
    trainer._set_mode(True)
    for _, p in trainer.trainable_named_parameters():
        p.grad = None
    torch.manual_seed(0)  # the policy's dropout draws
    stats, _ = trainer.forward_backward(batch, config)
    trainer._set_mode(False)
    return stats, {n: p.grad.clone() for n, p in trainer.trainable_named_parameters()}


def _moved(trainer: Trainer, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """Adapter values away from the trainer's own: another policy to anchor at."""
    gen = torch.Generator().manual_seed(9)
    return {n: p.detach() + scale * torch.randn(p.shape, generator=gen, dtype=p.dtype)
            for n, p in trainer.trainable_named_parameters()}


def test_a_reference_equal_to_the_adapter_gives_kl_0_and_the_kl_free_gradient(tokenizer, tmp_path):
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    names = [n for n, _ in trainer.trainable_named_parameters()]
    before = {n: p.detach().clone() for n, p in trainer.trainable_named_parameters()}
    # The reference read back from a checkpoint of this very adapter (the path the backends take).
    save_checkpoint(tmp_path, 3, model=model, optimizer=None, param_names=names)
    reference = adapter_tensors(latest_checkpoint(tmp_path), model=model, param_names=names)
    assert reference.keys() == before.keys() and all(torch.equal(reference[n], before[n]) for n in names)
    trainer.set_reference(reference, step=3)

    common = dict(micro_batch_tokens=40, max_seq_len=64)  # two micro-batches: the swap repeats per micro-batch
    stats, grads = _grads(trainer, random_batch(LENGTHS), TrainConfig(kl_coef=0.5, kl_reference_step=3, **common))
    plain, plain_grads = _grads(trainer, random_batch(LENGTHS), TrainConfig(kl_coef=0.0, **common))
    assert abs(stats.kl_sum) < 1e-12 and stats.tokens == 34
    assert stats.loss == pytest.approx(plain.loss, abs=1e-12)
    scale = max(float(g.abs().max()) for g in plain_grads.values())
    assert scale > 1e-6
    for n in names:  # at q = 0 the k3 term's gradient exp(q) - 1 is 0
        assert float((grads[n] - plain_grads[n]).abs().max()) <= 1e-10 * scale, n
        assert torch.equal(trainer.trainable_named_parameters()[names.index(n)][1], before[n]), n  # restored


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_a_different_reference_is_the_model_holding_those_weights(tokenizer, monkeypatch, dropout):
    """Against an independent computation: pi_ref from a second model whose adapter holds the reference,
    pi from the policy model as it is (the swap restored it before the policy forward), the loss by
    grpo_loss; then train_step's parameters are one AdamW step on that gradient. With dropout, the
    reference pass runs in eval mode (the independent model's pass does too)."""
    config = TrainConfig(kl_coef=0.2, kl_reference_step=1, micro_batch_tokens=10_000, max_seq_len=64,
                         learning_rate=1e-3, max_grad_norm=0.0)
    trainer = Trainer(lora_model(tokenizer, dropout=dropout))
    reference = _moved(trainer)
    trainer.set_reference(reference, step=1)
    seen = []
    monkeypatch.setattr(trainer_module, "grpo_loss",
                        lambda *a, **k: seen.append(k["ref_logprobs_BT"]) or grpo_loss(*a, **k))
    stats, grads = _grads(trainer, random_batch(LENGTHS), config)

    ids_BT, mask_BT, old_BT, adv_B = _padded(random_batch(LENGTHS))
    held = lora_model(tokenizer, dropout=dropout)  # the same base and adapter init; then the reference's values
    with torch.no_grad():
        for n, p in held.named_parameters():
            if n in reference:
                p.copy_(reference[n])
    held.eval()
    with torch.no_grad():
        ref_BT = token_logprobs(held, ids_BT, None, mask_BT, chunk_size=1024)
    assert len(seen) == 1 and torch.allclose(seen[0], ref_BT, atol=1e-12, rtol=0)

    policy = lora_model(tokenizer, dropout=dropout)
    policy.train()
    torch.manual_seed(0)  # the same dropout draws as the trainer's policy pass
    logp_BT = token_logprobs(policy, ids_BT, None, mask_BT, chunk_size=1024)
    terms = grpo_loss(logp_BT, old_BT, adv_B, mask_BT, epsilon=config.epsilon, epsilon_high=config.epsilon_high,
                      cispo=False, normalize="token", num_tokens=int(mask_BT.sum()), num_sequences=4,
                      max_len=config.max_seq_len, ref_logprobs_BT=ref_BT, kl_coef=config.kl_coef)
    terms.loss.backward()
    assert float(terms.kl_sum) > 1e-3  # the anchor differs from the policy
    assert stats.kl_sum == pytest.approx(float(terms.kl_sum), rel=1e-10)
    assert stats.loss == pytest.approx(float(terms.loss.detach()), rel=1e-10)
    expected = {n: p for n, p in policy.named_parameters() if n in grads}
    scale = max(float(p.grad.abs().max()) for p in expected.values())
    for n, p in expected.items():
        assert float((grads[n] - p.grad).abs().max()) <= 1e-9 * scale, n

    # The step: exactly AdamW's update of that gradient (no clipping), from the restored parameters.
    torch.optim.AdamW(list(expected.values()), lr=config.learning_rate, weight_decay=0.0, foreach=False).step()
    trainer.train_step(random_batch(LENGTHS), config, step=0)
    for n, p in trainer.trainable_named_parameters():
        assert torch.allclose(p, expected[n], atol=1e-12, rtol=0), n


def test_the_anchor_must_be_the_configs_and_fit_the_adapter(tokenizer):
    trainer = Trainer(lora_model(tokenizer))
    config = TrainConfig(kl_coef=0.1, kl_reference_step=2, max_seq_len=64)
    with pytest.raises(ValueError, match="kl_reference_step=2 but the trainer's KL reference is the base model"):
        trainer.train_step(random_batch(LENGTHS), config)
    reference = _moved(trainer)
    name = next(iter(reference))
    with pytest.raises(ValueError, match=r"1 tensor\(s\) missing"):
        trainer.set_reference({n: t for n, t in reference.items() if n != name}, step=2)
    with pytest.raises(ValueError, match="1 of another shape"):
        trainer.set_reference({**reference, name: reference[name][:1]}, step=2)
    with pytest.raises(ValueError, match="give a checkpoint step >= 1 with its tensors"):
        trainer.set_reference(None, step=2)
    trainer.set_reference(reference, step=2)
    assert trainer.train_step(random_batch(LENGTHS), config)["kl"] > 0
    # kl_coef 0 skips the reference pass, so any anchor (or none) is fine; 0 and None are the base model.
    assert trainer.train_step(random_batch(LENGTHS), TrainConfig(kl_reference_step=7, max_seq_len=64))["kl"] == 0.0
    trainer.set_reference(None, step=None)
    assert trainer.train_step(random_batch(LENGTHS), TrainConfig(kl_coef=0.1, kl_reference_step=0, max_seq_len=64))["kl"] > 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_kl_reference_step_must_be_a_step(bad):
    with pytest.raises(ConfigError, match="kl_reference_step=.* must be a checkpoint step"):
        TrainConfig(kl_reference_step=bad)
    assert TrainConfig(kl_reference_step=0).kl_reference_step == 0


def test_retention_keeps_the_steps_in_use(tokenizer, tmp_path):
    model = lora_model(tokenizer)
    names = [n for n, _ in Trainer(model).trainable_named_parameters()]
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model=model, optimizer=None, param_names=names)
    assert prune_checkpoints(tmp_path, best_metric="val/reward", keep=[2]) == [1, 3]
