"""Batch invariance under the arrivals a training run sees: several policy versions served at once
(``name@k`` adapters and the base), requests arriving at random moments (some while others are in
prefill, some mid-decode, batches of 1 to a few rows), n > 1, and a new version loaded while others
decode. A seeded request's tokens AND logprobs must be bitwise the same whatever the arrival pattern:
the loop test (tests/loop/test_loop_e2e.py) relies on it for two runs of one seed to be one run.
"""

from __future__ import annotations

import asyncio
import random

import torch

from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model

ADAPTERS = (None, "a1", "a2")


def peaked(tok):
    model, tok = tiny_random_model(seed=0, tokenizer=tok)
    with torch.no_grad():
        model.model.norm.weight.mul_(10.0)  # a peaked distribution: not every token is a coin toss
    return model, tok


def make_requests(tok) -> list[GenerationRequest]:
    out = []
    for i in range(12):
        prompt = tok.apply_chat_template([{"role": "user", "content": f"Topic {i}." + " more" * (i % 5)}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        out.append(GenerationRequest(prompt_ids=prompt, max_new_tokens=3 + i % 4, n=2 if i % 5 == 2 else 1,
                                     adapter=ADAPTERS[i % 3], sampling=SamplingParams(temperature=1.0, seed=7 * i)))
    return out


def run_pattern(engine: Engine, tok, a2_dir: str, rng: random.Random | None) -> list:
    """All at once (rng None), or each request after a random delay; a2 is loaded after a delay too,
    while a1 and base requests decode, and its requests wait for it."""
    reqs = make_requests(tok)
    loaded = asyncio.Event() if rng is not None else None

    async def one(r: GenerationRequest, delay: float):
        await asyncio.sleep(delay)
        if r.adapter == "a2" and loaded is not None:
            await loaded.wait()
        return await engine.generate(r)

    async def load_a2(delay: float):
        await asyncio.sleep(delay)
        await asyncio.to_thread(engine.add_adapter, "a2", a2_dir)
        loaded.set()

    async def run() -> list:
        if rng is None:
            engine.add_adapter("a2", a2_dir)
            return await asyncio.gather(*(one(r, 0.0) for r in reqs))
        delays = [rng.choice((0.0, rng.random() * 0.02, rng.random() * 0.1)) for _ in reqs]
        results, _ = await asyncio.gather(asyncio.gather(*(one(r, d) for r, d in zip(reqs, delays))),
                                          load_a2(rng.random() * 0.05))
        return results

    results = asyncio.run(run())
    engine.remove_adapter("a2")
    return [[(c.token_ids, c.logprobs) for c in r.completions] for r in results]


def test_tokens_and_logprobs_do_not_depend_on_arrival_times(tiny, adapter_dirs):
    runs = {}
    for max_batch_size in (16, 4):
        model, tok = peaked(tiny[1])  # a fresh copy per engine (an engine's adapters are injected into its model)
        engine = Engine(model, tok, max_batch_size=max_batch_size, batch_invariant=True)
        try:
            engine.add_adapter("a1", adapter_dirs[1])
            runs[(max_batch_size, "together")] = run_pattern(engine, tok, adapter_dirs[2], None)
            for k in range(3):
                runs[(max_batch_size, k)] = run_pattern(engine, tok, adapter_dirs[2], random.Random(k))
        finally:
            engine.close()
    first = runs[(16, "together")]
    assert all(len(c[0]) > 0 and len(c[1]) == len(c[0]) for r in first for c in r)
    # the versions really differ (else the test could not see a mix-up between them)
    assert len({repr(first[i]) for i in (0, 1, 2)}) == 3 or first[0] != first[1]
    for key, got in runs.items():
        for i, (a, b) in enumerate(zip(first, got)):
            assert a == b, f"request {i} ({ADAPTERS[i % 3]}) differs in arrival pattern {key}"


def test_a_row_s_logprobs_do_not_depend_on_the_other_rows_sampling_settings(tiny):
    """Rows that need the full log-softmax (top_logprobs, a temperature other than 1, greedy, top-p)
    must not change how the logprobs of the other rows in their batch are computed: a training rollout
    shares decode steps with judge calls, evaluations at temperature 0 and requests asking for
    alternatives, and which of them it meets depends on timing."""
    model, tok = peaked(tiny[1])
    engine = Engine(model, tok, max_batch_size=8, batch_invariant=True)

    def req(i: int, **sampling) -> GenerationRequest:
        prompt = tok.apply_chat_template([{"role": "user", "content": f"Question {i}."}],
                                         add_generation_prompt=True, tokenize=True, return_dict=False)
        return GenerationRequest(prompt_ids=prompt, max_new_tokens=6, sampling=SamplingParams(**sampling))

    def with_others(others: list[dict]) -> tuple:
        async def run():
            main = req(0, temperature=1.0, seed=5)
            got = await asyncio.gather(engine.generate(main), *(engine.generate(req(1 + k, **o)) for k, o in enumerate(others)))
            return got[0].completions[0].token_ids, got[0].completions[0].logprobs
        return asyncio.run(run())

    try:
        alone = with_others([])
        for others in ([{"temperature": 0.0}], [{"temperature": 1.0, "seed": 1, "top_logprobs": 3}],
                       [{"temperature": 0.7, "seed": 2}], [{"temperature": 1.0, "seed": 3, "top_p": 0.9}]):
            assert with_others(others) == alone, f"beside {others}"
    finally:
        engine.close()
