"""The engine's batch-invariant mode: a seeded request's tokens AND logprobs are bitwise the same
whichever requests share its batches, in whatever order they arrive.

Without it, a row's logits change by ulps with the rows beside it (CPU attention sums over the batch's
longest row, a one-row linear takes another kernel, a prompt's KV may come from the prefix cache, a
one-adapter batch runs from merged weights): seeded samples rarely flip, but the logprobs the trainer
takes as its old policy differ, so two runs of one seed drift apart (engine.py's module doc).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from groupwise.errors import ConfigError
from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model

QUESTIONS = [f"Say something short about topic {i}." for i in range(8)]


def peaked(tok):
    """A fresh copy per engine (an engine's adapters are injected into its model's layers)."""
    model, tok = tiny_random_model(seed=0, tokenizer=tok)
    with torch.no_grad():
        model.model.norm.weight.mul_(10.0)  # a peaked distribution: not every token is a coin toss
    return model, tok


def requests(tok) -> list[GenerationRequest]:
    """Prompts of different lengths, every other one through the adapter, two with n = 2."""
    out = []
    for i, q in enumerate(QUESTIONS):
        prompt = tok.apply_chat_template([{"role": "user", "content": q + " more" * (i % 4)}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        out.append(GenerationRequest(prompt_ids=prompt, max_new_tokens=4 + 2 * (i % 3), n=2 if i in (3, 6) else 1,
                                     adapter="a1" if i % 2 else None,
                                     sampling=SamplingParams(temperature=1.0, seed=100 + 10 * i)))
    return out


def outcomes(engine: Engine, tok, pattern: str) -> list:
    reqs = requests(tok)

    async def run() -> list:
        if pattern == "together":
            return await asyncio.gather(*(engine.generate(r) for r in reqs))
        if pattern == "one by one":
            return [await engine.generate(r) for r in reqs]
        if pattern == "reversed":
            return (await asyncio.gather(*(engine.generate(r) for r in reversed(reqs))))[::-1]

        async def late(i: int, r: GenerationRequest):  # arrivals spread over the first decode steps
            await asyncio.sleep(0.005 * i)
            return await engine.generate(r)

        return await asyncio.gather(*(late(i, r) for i, r in enumerate(reqs)))

    results = asyncio.run(run())
    return [[(c.token_ids, c.logprobs) for c in r.completions] for r in results]


def test_a_request_gets_the_same_bits_whatever_runs_beside_it(tiny, adapter_dirs):
    runs = {}
    for max_batch_size in (16, 3):  # 3: requests queue, and batches of 1 to 3 rows run
        model, tok = peaked(tiny[1])
        engine = Engine(model, tok, max_batch_size=max_batch_size, batch_invariant=True)
        try:
            engine.add_adapter("a1", adapter_dirs[1])
            patterns = ("together", "one by one", "reversed", "spread") if max_batch_size > 3 else ("together",)
            for pattern in patterns:
                runs[(max_batch_size, pattern)] = outcomes(engine, tok, pattern)
            assert engine.prefix_cache is None  # a cached prefix's KV was computed in another batch
        finally:
            engine.close()
    first = runs[(16, "together")]
    assert all(len(c[0]) > 0 for r in first for c in r)
    for key, got in runs.items():
        assert got == first, f"{key} differs from all requests together"


def test_batch_invariant_is_refused_where_it_cannot_hold(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match="oneDNN"):
        Engine(model, tok, batch_invariant=True, onednn_linear=False)
    with pytest.raises(ConfigError, match="unmerged"):
        Engine(model, tok, batch_invariant=True, merge_adapters=True)


def test_a_decode_rows_linear_is_the_same_at_any_batch_size():
    # Past some row count oneDNN may take another kernel (16 rows on an Intel Xeon): a decode pass's rows
    # go in blocks of 2 to ROW_BLOCK, so a row's bits never depend on how many rows run with it.
    from groupwise.inference.cpu_linear import ROW_BLOCK, _onednn_forward_rows_invariant

    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(96, 200, bias=False)
    x = torch.randn(3 * ROW_BLOCK + 3, 1, 96, generator=g)
    with torch.no_grad():
        alone = [_onednn_forward_rows_invariant(lin, x[j:j + 1])[0] for j in range(len(x))]
        for n in range(1, len(x) + 1):
            out = _onednn_forward_rows_invariant(lin, x[:n])
            assert out.shape == (n, 1, 200)
            assert all(torch.equal(out[j], alone[j]) for j in range(n)), n


def test_batch_invariant_is_refused_on_a_cpu_whose_kernels_depend_on_the_rows(tiny, monkeypatch):
    # What a CPU whose kernel changes within a block would do: the engine checks at start, and says so.
    from groupwise.inference import cpu_linear

    honest = cpu_linear._onednn_forward

    def varying(self, x):
        y = honest(self, x)
        return y + 1e-7 * (x.numel() // x.shape[-1] >= 5)  # other bits from 5 rows on

    monkeypatch.setattr(cpu_linear, "_onednn_forward", varying)
    monkeypatch.setattr(cpu_linear, "_CHECKED", {})
    model, tok = tiny
    with pytest.raises(ConfigError, match=r"other bits depending on the rows beside it .*at \[5, 6, 7, 8\] rows"):
        Engine(model, tok, batch_invariant=True)
