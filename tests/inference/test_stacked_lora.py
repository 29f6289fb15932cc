"""Mixed-adapter batches through the stacked slot adapters (stacked_lora.py): the same tokens and, to
float rounding, the same logprobs as each request served alone; a graph per bucket for any mix
(one ``__mixed__`` graph, not one per adapter set); refilled in place when a slot gets new weights."""

from __future__ import annotations

import asyncio

import pytest

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
