"""The trainer's fused LoRA layer computes peft's function, falls back where it must, and leaves no trace."""

import torch

from groupwise.config import LoraConfig
from groupwise.training.lora_forward import TrainingForward, fast_lora_ok
from groupwise.training.adapters import wrap_with_lora


def _model(tokenizer, dropout=0.0):
    from groupwise.runtime.loading import tiny_random_model

    model, _ = tiny_random_model(seed=0, tokenizer=tokenizer, dtype=torch.float64)
    peft_model = wrap_with_lora(model, LoraConfig(rank=4, alpha=8, dropout=dropout))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:  # peft starts B at 0; a random B makes the adapter's term non-zero
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
    return peft_model


def _tuners(model):
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [m for m in model.modules() if isinstance(m, BaseTunerLayer)]


def _loss_and_grads(model, ids):
    for p in model.parameters():
        p.grad = None
    logits = model(input_ids=ids).logits
    loss = (logits.log_softmax(-1)[..., 7]).sum()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_fused_layers_equal_peft_in_fp64_and_are_removed_after(tokenizer):
    model = _model(tokenizer)
    tuners = _tuners(model)
    assert tuners and all(fast_lora_ok(m) for m in tuners)  # q/k/v/o/gate/up/down of every layer
    ids = torch.randint(3, 500, (2, 9), generator=torch.Generator().manual_seed(3))
    loss_peft, grads_peft = _loss_and_grads(model, ids)
    with TrainingForward(tuners, "cpu", None):
        assert all("forward" in m.__dict__ for m in tuners)
        loss_fused, grads_fused = _loss_and_grads(model, ids)
    assert not any("forward" in m.__dict__ for m in tuners)  # the engine sees peft's layers again
    assert len(grads_peft) == 2 * len(tuners)  # lora_A and lora_B of each layer got a gradient
    assert torch.allclose(loss_fused, loss_peft, atol=1e-12, rtol=0)
    for n in grads_peft:
        assert torch.allclose(grads_fused[n], grads_peft[n], atol=1e-12, rtol=0), n


def test_dropout_and_disabled_adapters_take_peft_own_path(tokenizer):
    assert not any(fast_lora_ok(m) for m in _tuners(_model(tokenizer, dropout=0.1)))
    model = _model(tokenizer)
    ids = torch.randint(3, 500, (1, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        with model.disable_adapter():
            base = model(input_ids=ids).logits
        with TrainingForward(_tuners(model), "cpu", None), model.disable_adapter():
            fused_disabled = model(input_ids=ids).logits
        adapted = model(input_ids=ids).logits
    assert torch.equal(fused_disabled, base)  # the reference pass of the KL term: base model only
    assert not torch.allclose(adapted, base)  # ... and the adapter does change the output


def test_training_forward_and_backward_run_without_cudnn_attention(tokenizer, cudnn_attention_at_each_call):
    """Micro-batches differ in rows and padded length, and cuDNN's SDPA builds a graph per new shape
    (groupwise/runtime/attention_backends.py): the trainer's forward context switches it off and back."""
    seen = cudnn_attention_at_each_call
    model = _model(tokenizer)
    ids = torch.randint(3, 500, (2, 5), generator=torch.Generator().manual_seed(5))
    with TrainingForward(_tuners(model), "cpu", None):
        _loss_and_grads(model, ids)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()
