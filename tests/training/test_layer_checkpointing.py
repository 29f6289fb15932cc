"""The trainer's per-step switch of layer checkpointing: the layers recompute in the backward, the step's
gradient is the uncheckpointed one, and nothing is left on the model after the step (the engine shares it)."""

from __future__ import annotations


import torch
from gw_train_helpers import lora_model, random_batch

from groupwise.config import TrainConfig
from groupwise.training.logprobs import base_and_decoder
from groupwise.training.trainer import Trainer


def _hooks(module: torch.nn.Module) -> int:
    return len(module._forward_hooks) + len(module._forward_pre_hooks)


def test_steps_leave_no_hook_and_no_flag_behind(tokenizer):
    """transformers' enable call registers a forward hook on the input embeddings that its disable call
    keeps for a peft-wrapped model: one more hook a step, run on every later forward (the engine's too)."""
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    base, _ = base_and_decoder(model)
    embeddings = base.get_input_embeddings()
    before = _hooks(embeddings)
    config = TrainConfig(gradient_checkpointing=True, max_seq_len=64, learning_rate=1e-3)
    for step in range(3):
        trainer.train_step(random_batch(seed=5), config, step=step)
    assert _hooks(embeddings) == before
    assert not base.is_gradient_checkpointing  # left off for the engine
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def test_checkpointed_layers_recompute_in_the_backward(tokenizer):
    """With checkpointing on, what runs inside a decoder layer runs twice a micro-batch (forward, then its
    recompute in the backward); off, once. Counted on each layer's attention."""
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    _, decoder = base_and_decoder(model)
    calls = []
    for layer in decoder.layers:
        layer.self_attn.register_forward_hook(lambda *_: calls.append(1))
    counts = {}
    for on in (False, True, False):
        calls.clear()
        trainer.train_step(random_batch(seed=5), TrainConfig(gradient_checkpointing=on, max_seq_len=64, micro_batch_tokens=10_000))
        counts.setdefault(on, []).append(len(calls))
    layers = len(decoder.layers)
    assert counts == {False: [layers, layers], True: [2 * layers]}


def test_the_embeddings_output_gets_no_gradient_and_the_adapter_the_same_one(tokenizer):
    """Nothing reads the gradient of the frozen embeddings' output, so the backward does not compute it;
    the adapter's gradient equals the one with the output marked as needing a gradient (what transformers'
    switch did), in fp64."""
    model = lora_model(tokenizer)
    trainer = Trainer(model)
    base, decoder = base_and_decoder(model)
    seen = []

    def first_layer_input(module, args, kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        seen.append(hidden.requires_grad)

    handle = decoder.layers[0].register_forward_pre_hook(first_layer_input, with_kwargs=True)
    grads = []
    for marked in (False, True):
        extra = None
        if marked:
            extra = base.get_input_embeddings().register_forward_hook(lambda m, i, out: out.requires_grad_(True))
        for _, p in trainer.trainable_named_parameters():
            p.grad = None
        trainer._activate()
        trainer._set_layer_checkpointing(True)
        model.train()
        try:
            trainer.forward_backward(random_batch(seed=5), TrainConfig(max_seq_len=64, gradient_checkpointing=True))
        finally:
            trainer._set_layer_checkpointing(False)
            if extra is not None:
                extra.remove()
        grads.append({n: p.grad.clone() for n, p in trainer.trainable_named_parameters()})
    handle.remove()
    assert seen[0] is False and seen[-1] is True  # the hook's output reached the first layer
    assert max(float(g.abs().max()) for g in grads[0].values()) > 1e-8
    assert all(torch.allclose(grads[0][n], grads[1][n], rtol=0, atol=1e-12) for n in grads[0])


def test_a_model_of_the_older_format_keeps_one_hook_and_trains_its_first_layer(tokenizer):
    """A model with its own `_set_gradient_checkpointing(module, value)` (remote code of the format before
    transformers 4.35) goes through transformers' switch, whose checkpointing may be reentrant: that needs
    the embeddings' hook, so it stays, but one at most, however many steps."""
    import functools
    import types

    from torch.utils.checkpoint import checkpoint

    model = lora_model(tokenizer)
    trainer = Trainer(model)
    base, decoder = base_and_decoder(model)

    def old_format(self, module, value=False):
        if hasattr(module, "gradient_checkpointing"):
            module._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=True)
            module.gradient_checkpointing = value

    base._set_gradient_checkpointing = types.MethodType(old_format, base)
    embeddings = base.get_input_embeddings()
    before = _hooks(embeddings)
    first = {n: p.detach().clone() for n, p in decoder.layers[0].named_parameters() if "lora_" in n}
    config = TrainConfig(gradient_checkpointing=True, max_seq_len=64, learning_rate=1e-2)
    for step in range(3):
        trainer.train_step(random_batch(seed=5), config, step=step)
        assert _hooks(embeddings) <= before + 1
    moved = [n for n, p in decoder.layers[0].named_parameters() if "lora_" in n and not torch.equal(p, first[n])]
    assert len(moved) == len(first) > 0  # reentrant recompute got its gradient: the hook was in place
    assert not base.is_gradient_checkpointing
