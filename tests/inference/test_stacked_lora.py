"""Mixed-adapter batches through the stacked slot adapters (stacked_lora.py): the same tokens and, to
float rounding, the same logprobs as each request served alone; a graph per bucket for any mix
(one ``__mixed__`` graph, not one per adapter set); refilled in place when a slot gets new weights."""

from __future__ import annotations

import asyncio

import pytest
import torch

from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.runner import MIXED
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model


def _request(prompt, adapter, seed, n=10):
    return GenerationRequest(prompt, max_new_tokens=n, ignore_eos=True, adapter=adapter,
                             sampling=SamplingParams(temperature=1.0, seed=seed))


async def _mixed_and_alone(eng, tok, adapters):
    prompts = [tok.encode(f"question {i}: how many legs has a {w}?") for i, w in enumerate(["cat", "bird", "ant", "fish"])]
    jobs = [(p, a, 7 * i + j) for i, p in enumerate(prompts) for j, a in enumerate(adapters)]
    mixed = await asyncio.gather(*[eng.generate(_request(p, a, s)) for p, a, s in jobs])
    alone = [await eng.generate(_request(p, a, s)) for p, a, s in jobs]
    return mixed, alone


def _assert_same(mixed, alone):
    for m, a in zip(mixed, alone):
        assert m.completions[0].token_ids == a.completions[0].token_ids
        diff = max(abs(x - y) for x, y in zip(m.completions[0].logprobs, a.completions[0].logprobs))
        assert diff < 1e-4


@pytest.mark.parametrize("graphs", [False, True])
async def test_mixed_batch_equals_each_request_alone(tiny, adapter_dirs, graphs):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=16, cuda_graphs=graphs)
    try:
        eng.add_adapter("a1", adapter_dirs[1])
        eng.add_adapter("a2", adapter_dirs[2])
        mixed, alone = await _mixed_and_alone(eng, tok, [None, "a1", "a2"])
        _assert_same(mixed, alone)
        # the adapters differ, so the comparison means something
        assert len({tuple(r.completions[0].token_ids) for r in mixed[:3]}) == 3
        stack = eng.runner.stacked
        assert stack is not None and len(stack.slots) == 2  # the mixed passes went through the stack
        if graphs:  # off CUDA the graph path runs eagerly (EagerReplay) on the same static buffers
            assert any(k[2] == MIXED for k in eng.runner.graphs)
    finally:
        eng.close()


async def test_the_stack_follows_a_slot_refilled_with_new_weights(tiny, adapter_dirs):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=16, cuda_graphs=True)
    try:
        eng.add_adapter("a1", adapter_dirs[1])
        eng.add_adapter("a2", adapter_dirs[2])
        await _mixed_and_alone(eng, tok, ["a1", "a2"])
        A_before = [layer.A.data_ptr() for layer in eng.runner.stacked._layers]
        eng.remove_adapter("a1")
        eng.add_adapter("a3", adapter_dirs[3])  # copied into a1's slot
        mixed, alone = await _mixed_and_alone(eng, tok, ["a3", "a2", None])
        _assert_same(mixed, alone)
        # in place: the buffers (and the graphs reading them) kept their addresses
        assert [layer.A.data_ptr() for layer in eng.runner.stacked._layers] == A_before
    finally:
        eng.close()


def test_batch_invariant_engines_keep_peft_path(tiny):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=4, batch_invariant=True)
    try:
        assert eng.runner.stacked is None
    finally:
        eng.close()


def _two_slot_model(dtype):
    """A tiny Llama in `dtype` with two fp32 LoRA slots on every linear layer (random, non-zero B)."""
    from peft import LoraConfig, get_peft_model

    base, _ = tiny_random_model(seed=0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        model = get_peft_model(base.to(dtype), config, adapter_name="s0")
        model.add_adapter("s1", config)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.data = p.data.float()
                    if "lora_B" in name:
                        p.normal_(0.0, 2.0 / p.shape[1] ** 0.5)
    return model.eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_stack_runs_in_the_base_dtype_and_multiplies_a_shared_input_once(dtype, monkeypatch):
    from peft.tuners.tuners_utils import BaseTunerLayer

    from groupwise.inference import stacked_lora
    from groupwise.inference.stacked_lora import StackedLora

    model = _two_slot_model(dtype)
    modules = list(model.modules())
    layers = [m for m in modules if isinstance(m, BaseTunerLayer)]
    parents = {id(child): id(m) for m in modules for child in m.children()}
    stack = StackedLora()
    assert stack.prepare(layers, ["s0", "s1"], parent_of=lambda: parents) is True
    groups = {id(e.group): e.group for e in stack._layers}.values()
    assert {g.A.dtype for g in groups} == {dtype}  # adapters are fp32: the stack follows the base
    blocks = model.get_base_model().config.num_hidden_layers
    # per block: self_attn's q, k, v, o; the MLP's gate and up (input size hidden); its down (input size intermediate)
    assert len(groups) == 3 * blocks and len(stack._layers) == 7 * blocks

    products = []
    columns = stacked_lora._Group.columns

    def counting(group, x, cols):
        fresh = group.last is None or group.last[0] is not x or group.last[1] > cols.start
        products.append(fresh)
        return columns(group, x, cols)

    monkeypatch.setattr(stacked_lora._Group, "columns", counting)
    ids = torch.tensor([[3, 17, 9, 41, 5]] * 3)
    with torch.no_grad():
        with stack.serving(torch.tensor([-1, 0, 1])):
            mixed = model(input_ids=ids).logits.float()
        with model.disable_adapter():  # the same 3 rows each time: a matmul's bits depend on its rows
            base = model(input_ids=ids).logits.float()
        alone = []
        for slot in ("s0", "s1"):
            model.set_adapter(slot)
            alone.append(model(input_ids=ids).logits.float())
    # q (k and v reuse its product), o (another input), gate (up reuses it), down: 4 products of 7 layers
    assert len(products) == 7 * blocks and sum(products) == 4 * blocks
    assert (mixed[0] - base[0]).abs().max() < (1e-5 if dtype == torch.float32 else 1e-2)  # it adds zeros
    for row, ref in zip(mixed[1:], alone):
        effect = (ref[0] - base[0]).abs().max()
        assert effect > 0.05  # the adapters change the logits, so the comparison means something
        error = (row - ref[0]).abs().max()
        assert error < (1e-4 if dtype == torch.float32 else 0.1 * effect), (error, effect)
