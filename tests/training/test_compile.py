"""Compiled training steps: no recompilation when the engine adds adapters, the eager step's numbers.

The engine shares the model and keeps served adapters as extra peft adapters (its slots, named
``gw-slot-<k>``). peft's LoRA forward reads every layer's adapter dict, so compiled decoder layers
over it recompiled for each new slot; the trainer's `AdapterForwards` read only its own adapter.

Compilations are counted with ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: one per
graph dynamo captures (its backward is compiled with it). This model gives 2 per shape: layer 0's
input does not require grad (the embeddings are frozen), layer 1's does, and that is guarded.
"""

from __future__ import annotations

import math

import pytest
import torch

from groupwise.config import LoraConfig, TrainConfig
from groupwise.training.lora_forward import _ADAPTER_ATTR, AdapterForwards
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence
from groupwise.training.adapters import wrap_with_lora
from groupwise.training.trainer import Trainer

VOCAB = 100
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _random_b(model, adapter: str, seed: int) -> None:
    # peft starts B at 0 (the adapter's term would vanish and dL/dA = 0): a random B makes it count.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n and f".{adapter}." in n:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)


def _qwen2_lora(dtype=torch.float32, dropout: float = 0.0):
    """A tiny random Qwen2 (the GPU bench's architecture: biased q/k/v) with the trainer's adapter."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config).to(dtype)
    model = wrap_with_lora(model, LoraConfig(rank=4, alpha=8, dropout=dropout, target_modules=TARGETS))
    _random_b(model, "default", seed=1)
    return model


def _add_slot(model, k: int) -> None:
    """What the engine's adapter slots do: another peft adapter of the same shape, own weights."""
    from peft import LoraConfig as PeftLoraConfig

    name = f"gw-slot-{k}"
    model.add_adapter(name, PeftLoraConfig(r=4, lora_alpha=8, target_modules=list(TARGETS)))
    _random_b(model, name, seed=10 + k)


def _batch(length: int, seed: int = 2) -> TokenizedBatch:
    """4 sequences of one length (so [B, T] = [4, length]); the second half of each is trained."""
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for b, adv in enumerate([1.0, -1.0, 0.5, -0.5]):
        ids = torch.randint(1, VOCAB, (length,), generator=gen).tolist()
        mask = [t >= length // 2 for t in range(length)]
        # near a random model's log-prob (-ln 100 = -4.6), so ratios stay inside the clip and every token counts
        old = [(-4.6 + 0.01 * t) if m else math.nan for t, m in enumerate(mask)]
        seqs.append(TokenizedSequence(ids, mask, old, advantage=adv, trajectory_index=b))
    return TokenizedBatch(sequences=seqs, num_groups=1)


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _loss_and_grad(trainer: Trainer, batch: TokenizedBatch, config: TrainConfig) -> tuple[float, torch.Tensor]:
    """train_step's forward and backward (no optimizer step): the step's loss and LoRA gradient."""
    trainer._activate()
    trainer._set_mode(True)
    trainer._set_layer_checkpointing(config.gradient_checkpointing)
    for _, p in trainer.trainable_named_parameters():
        p.grad = None
    try:
        stats, _ = trainer.forward_backward(batch, config)
    finally:
        trainer._set_layer_checkpointing(False)
        trainer._set_mode(False)
    grad = torch.cat([p.grad.flatten() for _, p in trainer.trainable_named_parameters()])
    return stats.loss, grad


@pytest.fixture
def fresh_dynamo():
    # Dynamo caches compiled code on the layer's code object, which other tests' models share:
    # start empty so the counts are this test's, and leave nothing behind.
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_steps_survive_new_adapters_and_lengths_and_equal_eager(fresh_dynamo):
    model = _qwen2_lora()
    trainer = Trainer(model, pad_token_id=0)
    common = dict(max_seq_len=64, micro_batch_tokens=10_000, learning_rate=1e-3, kl_coef=0.05)
    compiled, eager = TrainConfig(compile=True, **common), TrainConfig(compile=False, **common)

    start = _graphs()
    trainer.train_step(_batch(20), compiled, step=0)
    first = _graphs() - start
    assert not trainer._compile_failed and first >= 2, first  # it did compile (layers 0 and 1, + KL's pass)

    # After each step the engine loads the new adapter into a new slot and serves it (eagerly: it
    # must not see the trainer's patch), as in steps 1 and 2 of bench/train_step.py; then no new slot.
    for step in (1, 2, 3):
        if step < 3:
            _add_slot(model, step - 1)
            model.set_adapter(f"gw-slot-{step - 1}")
            with torch.no_grad():
                model(input_ids=torch.arange(1, 9)[None])
        trainer.train_step(_batch(20, seed=step), compiled, step=step)
        assert _graphs() - start == first, step  # the new adapter recompiled nothing (peft's forward did)

    tuners = trainer._modules()[1]
    assert not any("forward" in m.__dict__ or _ADAPTER_ATTR in m.__dict__ for m in tuners)  # engine sees peft
    assert not any("forward" in layer.__dict__ for layer in model.get_base_model().model.layers)

    # The same step, compiled and eager, with the slots present (a wrong adapter would show here).
    loss_c, grad_c = _loss_and_grad(trainer, _batch(20, seed=7), compiled)
    loss_e, grad_e = _loss_and_grad(trainer, _batch(20, seed=7), eager)
    assert _graphs() - start == first
    scale = float(grad_e.abs().max())
    assert scale > 1e-4 and abs(loss_e) > 1e-4  # neither is trivially zero
    # fp32 (eps 1.2e-7): the compiled kernels sum in another order (over 64 hidden units, 40 trained
    # tokens, 2 layers); measured 9e-7 (loss) and 6e-7 (gradient) relative, 1e-5 leaves a 10x margin
    # while a wrong adapter or a lost LoRA term (a change of order 1) would fail by far.
    assert loss_c == pytest.approx(loss_e, rel=1e-5, abs=0)
    assert float((grad_c - grad_e).abs().max()) <= 1e-5 * scale

    # New sequence lengths: one more compilation makes the length dynamic, then none per length.
    trainer.train_step(_batch(24), compiled, step=4)
    dynamic = _graphs() - start - first
    assert dynamic <= first, dynamic
    for step, length in enumerate((28, 33, 17), start=5):
        trainer.train_step(_batch(length), compiled, step=step)
    assert _graphs() - start == first + dynamic


def test_a_checkpoint_anchor_is_seen_by_compiled_layers_and_restored(fresh_dynamo):
    """TrainConfig.kl_reference_step: the reference values are copied into the adapter's own tensors,
    which the compiled layers read (`AdapterForwards`), so the compiled step equals the eager one; the
    policy pass sees the adapter's values again, and the step leaves them bitwise as they were."""
    model = _qwen2_lora()
    trainer = Trainer(model, pad_token_id=0)
    gen = torch.Generator().manual_seed(4)
    trainer.set_reference({n: p.detach() + 0.3 * torch.randn(p.shape, generator=gen)
                           for n, p in trainer.trainable_named_parameters()}, step=1)
    before = [p.detach().clone() for _, p in trainer.trainable_named_parameters()]
    common = dict(max_seq_len=64, micro_batch_tokens=10_000, kl_coef=0.5, kl_reference_step=1)
    start = _graphs()
    loss_c, grad_c = _loss_and_grad(trainer, _batch(20), TrainConfig(compile=True, **common))
    assert _graphs() > start and not trainer._compile_failed  # it did compile
    assert all(torch.equal(p, b) for (_, p), b in zip(trainer.trainable_named_parameters(), before))
    loss_e, grad_e = _loss_and_grad(trainer, _batch(20), TrainConfig(compile=False, **common))
    loss_0, _ = _loss_and_grad(trainer, _batch(20), TrainConfig(max_seq_len=64, micro_batch_tokens=10_000))
    assert loss_e - loss_0 > 1e-3  # the anchor's KL term counts (0.5 x its mean k3)
    # fp32, compiled kernels sum in another order: the tolerance of the test above
    assert loss_c == pytest.approx(loss_e, rel=1e-5, abs=0)
    assert float((grad_c - grad_e).abs().max()) <= 1e-5 * float(grad_e.abs().max())


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_adapter_forwards_are_peft_function_of_the_trainer_adapter_fp64(dropout):
    """Eager, fp64: with two other adapters loaded, the patched layers give peft's loss and gradients
    (dropout included: the same random draws, in peft's order), and the base alone when disabled."""
    model = _qwen2_lora(torch.float64, dropout=dropout)
    _add_slot(model, 0)
    _add_slot(model, 1)
    model.set_adapter("default")
    model.train()
    from peft.tuners.tuners_utils import BaseTunerLayer

    tuners = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))

    def run():
        for p in model.parameters():
            p.grad = None
        torch.manual_seed(5)
        loss = model(input_ids=ids).logits.log_softmax(-1)[..., 7].sum()
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss_peft, grads_peft = run()
    patch = AdapterForwards("default")
    patch.install(tuners)
    assert len(patch.installed) == len(tuners) == 2 * len(TARGETS)
    try:
        loss_ours, grads_ours = run()
        with torch.no_grad(), model.disable_adapter():
            base_ours = model(input_ids=ids).logits
    finally:
        patch.remove()
    with torch.no_grad(), model.disable_adapter():
        base_peft = model(input_ids=ids).logits
    assert set(grads_ours) == set(grads_peft) and all(".default." in n for n in grads_peft)
    # fp64: the same function, summed in another order (one addmm): equal far below any training effect
    assert torch.allclose(loss_ours, loss_peft, atol=1e-12, rtol=0)
    for n in grads_peft:
        assert torch.allclose(grads_ours[n], grads_peft[n], atol=1e-12, rtol=0), n
    assert torch.equal(base_ours, base_peft)  # the KL reference pass: base model only
