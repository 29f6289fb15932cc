"""The decode graphs' fused norms, rotary and sampling (decode_fusion.py), through the graph path on the CPU.

Off CUDA a decode graph is its eager stand-in (decode_graphs.EagerReplay), so the fusion runs on every
replay here. Dynamo's ``aot_eager`` backend traces and partitions the same functions as Inductor would,
without generating code (Inductor's C++ build takes about a minute on a 2-core CPU); Inductor's own
kernels are checked on a GPU (test_cuda.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest
import torch
from torch._dynamo.utils import counters

from groupwise.inference.decode_fusion import ROTARY, DecodeFusion
from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model


def prompts(tok, k):
    return [tok.apply_chat_template([{"role": "user", "content": "hi " * (i + 1)}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"] for i in range(k)]


async def _generate(tok, adapter_dir, fusion: DecodeFusion | None):
    model, tok = tiny_random_model(seed=0, tokenizer=tok)
    eng = Engine(model, tok, max_batch_size=8, initial_capacity=16, cuda_graphs=True, fuse_decode=False)
    eng.runner.fusion = fusion
    try:
        eng.add_adapter("a1", adapter_dir)
        ps = prompts(tok, 5)
        # rows finish at different lengths: batch buckets 8, 4, 2, 1 (recompiles are what dynamic=True avoids)
        runs = await asyncio.gather(*[eng.generate(GenerationRequest(
            p, max_new_tokens=4 + 3 * i, ignore_eos=True, adapter="a1" if i % 2 else None,
            sampling=SamplingParams(seed=i, top_p=0.9 if i == 4 else 1.0))) for i, p in enumerate(ps)])
        return [(c.token_ids, c.logprobs) for r in runs for c in r.completions], eng.runner.model
    finally:
        eng.close()


async def test_fused_decode_gives_the_unfused_tokens_and_leaves_the_model_as_it_was(tiny, adapter_dirs):
    plain, _ = await _generate(tiny[1], adapter_dirs[1], None)
    frames = counters["frames"]["ok"]
    fused, model = await _generate(tiny[1], adapter_dirs[1], DecodeFusion(backend="aot_eager"))
    assert counters["frames"]["ok"] > frames  # the compiled pieces did run
    assert [t for t, _ in fused] == [t for t, _ in plain]
    for (_, a), (_, b) in zip(fused, plain):
        assert a is not None and b is not None and len(a) == len(b)
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    # nothing compiled outlives the captures: the norms' own forward, the module's own rotary function
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    assert norms and all("forward" not in m.__dict__ for m in norms)
    attention = next(m for m in model.modules() if type(m).__name__.endswith("Attention"))
    assert not hasattr(getattr(sys.modules[type(attention).__module__], ROTARY), "_torchdynamo_orig_callable")


async def test_a_fusion_that_fails_to_compile_warns_once_and_decodes_unfused(tiny, adapter_dirs):
    def broken(gm, example_inputs):
        raise RuntimeError("no compiler here")

    plain, _ = await _generate(tiny[1], adapter_dirs[1], None)
    fusion = DecodeFusion(backend=broken)
    with pytest.warns(UserWarning, match="fusion.*failed.*no compiler here") as caught:
        fused, _ = await _generate(tiny[1], adapter_dirs[1], fusion)
    assert not fusion.enabled
    assert len([w for w in caught if "fusion" in str(w.message)]) == 1
    assert [t for t, _ in fused] == [t for t, _ in plain]


def test_the_fusion_is_on_by_default_only_where_graphs_are_captured_on_cuda(tiny):
    model, tok = tiny
    for kwargs, expected in (({}, torch.cuda.is_available() and next(model.parameters()).is_cuda),
                             ({"cuda_graphs": True}, False), ({"fuse_decode": True}, True)):
        eng = Engine(model, tok, max_batch_size=2, **kwargs)
        try:
            assert (eng.runner.fusion is not None) == expected, kwargs
        finally:
            eng.close()
