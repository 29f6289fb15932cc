"""Merged-weight serving of one adapter on the CPU (inference/merged.py)."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from groupwise.inference.engine import Engine, GenerationRequest  # noqa: E402
from groupwise.inference.sampling import SamplingParams  # noqa: E402
from groupwise.runtime.loading import tiny_random_model  # noqa: E402


def _prompts(tok, k):
    return [tok.apply_chat_template([{"role": "user", "content": "tell me " * (i + 1)}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"] for i in range(k)]


async def _run(eng, tok, adapter, k=3, temperature=0.0):
    rs = await asyncio.gather(*[eng.generate(GenerationRequest(
        p, max_new_tokens=10, ignore_eos=True, adapter=adapter,
        sampling=SamplingParams(temperature=temperature, seed=i))) for i, p in enumerate(_prompts(tok, k))])
    return [r.completions[0] for r in rs]


async def test_merged_serving_equals_peft_layers_and_restores_the_base(tiny, adapter_dirs):
    outs = {}
    for merge in (True, False):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
        eng = Engine(model, tok, max_batch_size=8, merge_adapters=merge)
        try:
            eng.add_adapter("a1", adapter_dirs[1])
            layer = eng.runner.tuner_layers()[0]
            before_ptr, before = layer.base_layer.weight.data_ptr(), layer.base_layer.weight.detach().clone()
            outs[merge] = (await _run(eng, tok, "a1"), await _run(eng, tok, "a1", temperature=1.0),
                           await _run(eng, tok, None))
            assert (eng.runner.merged is not None and eng.runner.merged.adapter is not None) == merge  # merged copy built
            # the base weights are the model's own again after every forward
            assert layer.base_layer.weight.data_ptr() == before_ptr
            assert torch.equal(layer.base_layer.weight, before)
        finally:
            eng.close()
    for merged_run, peft_run in zip(outs[True], outs[False]):
        assert [c.token_ids for c in merged_run] == [c.token_ids for c in peft_run]
        diff = max(abs(a - b) for m, p in zip(merged_run, peft_run) for a, b in zip(m.logprobs, p.logprobs))
        assert diff < 1e-5, diff


async def test_changed_adapter_weights_are_served_after_a_pause(tiny, adapter_dirs):
    # The trainer changes its adapter in place inside a pause; the merged copy must not outlive that.
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=8)
    ref = Engine(tiny_random_model(seed=0, tokenizer=tiny[1])[0], tok, max_batch_size=8, merge_adapters=False)
    try:
        for e in (eng, ref):
            e.add_adapter("a1", adapter_dirs[1])
        first = await _run(eng, tok, "a1")
        for e in (eng, ref):
            with e.paused(), torch.no_grad():
                for m in e.runner.tuner_layers():
                    m.lora_B[e.peft_adapter_name("a1")].weight.add_(0.5)
        again, expected = await _run(eng, tok, "a1"), await _run(ref, tok, "a1")
        assert [c.token_ids for c in again] == [c.token_ids for c in expected]
        assert [c.token_ids for c in again] != [c.token_ids for c in first]
    finally:
        eng.close()
        ref.close()
