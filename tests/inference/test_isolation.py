"""The engine: a request's failure stays that request's (validated before batching, isolated when it
happens inside a batch), and a cancelled request stops using the model."""

from __future__ import annotations

import asyncio
import threading

import pytest

from groupwise.inference.engine import Engine, EngineError, GenerationRequest, RequestFailedError
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model


@pytest.fixture
def engine(tiny):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=8)
    yield eng
    eng.close()


def _valid(eng, i: int, n: int = 12) -> GenerationRequest:
    return GenerationRequest(eng.tokenizer(f"valid request {i}")["input_ids"], max_new_tokens=n, ignore_eos=True,
                             sampling=SamplingParams(seed=i))


def test_requests_a_batch_would_choke_on_are_refused_at_submit(engine):
    prompt = engine.tokenizer("hi")["input_ids"]
    for bad, needle in [
        (GenerationRequest(prompt, sampling=SamplingParams(seed=2**70)), "seed"),
        (GenerationRequest(prompt + [engine.vocab_size + 5]), "outside [0, "),
        (GenerationRequest(prompt + [-1]), "outside [0, "),
        (GenerationRequest(prompt, stop_token_ids=[10**9]), "stop_token_ids"),
        (GenerationRequest(prompt, sampling=SamplingParams(top_k=-3)), "top_k"),
    ]:
        with pytest.raises(EngineError, match=needle.replace("[", r"\[")):
            engine.submit(bad)
    assert not engine.state.waiting and not engine.state.running


async def test_a_failing_request_in_a_batch_fails_alone(engine):
    # The forward pass raises whenever a poisoned token is in its input: in the prefill of the
    # poisoned prompt, and in the decode step where the poisoned request feeds a poisoned position.
    real_forward = engine.runner.forward
    poison_token = 4242
    long_prompt = engine.tokenizer("poison " * 40)["input_ids"]
    poison_pos = len(long_prompt) + 2  # the third decode step of the long request

    def forward(input_ids, position_ids, *args, **kwargs):
        if bool((input_ids == poison_token).any()) or (input_ids.shape[1] == 1 and bool((position_ids == poison_pos).any())):
            raise RuntimeError("poisoned batch")
        return real_forward(input_ids, position_ids, *args, **kwargs)

    engine.runner.forward = forward
    alone = [(await engine.generate(_valid(engine, i))).completions[0].token_ids for i in range(3)]
    prefill_poison = GenerationRequest(engine.tokenizer("a")["input_ids"] + [poison_token], max_new_tokens=4)
    decode_poison = GenerationRequest(long_prompt, max_new_tokens=8, ignore_eos=True, sampling=SamplingParams(seed=9))
    futures = [engine.submit(_valid(engine, 0)), engine.submit(prefill_poison), engine.submit(_valid(engine, 1)),
               engine.submit(decode_poison), engine.submit(_valid(engine, 2))]
    results = await asyncio.gather(*[asyncio.wrap_future(f) for f in futures], return_exceptions=True)
    assert [r.completions[0].token_ids for r in (results[0], results[2], results[4])] == alone
    for r in (results[1], results[3]):
        assert isinstance(r, RequestFailedError) and "poisoned batch" in str(r)
    assert engine.stats.failed_requests == 2
    assert not engine.state.running and not engine.state.waiting
    again = await engine.generate(_valid(engine, 1))  # the engine serves on
    assert again.completions[0].token_ids == alone[1]


async def test_a_callback_error_fails_only_its_request(engine):
    def broken(index, token, logprob, finish):
        raise ValueError("the caller's callback broke")

    bad = GenerationRequest(engine.tokenizer("x")["input_ids"], max_new_tokens=6, on_token=broken)
    good = engine.submit(_valid(engine, 4))
    with pytest.raises(RequestFailedError, match="callback broke"):
        await engine.generate(bad)
    assert len((await asyncio.wrap_future(good)).completions[0].token_ids) == 12


async def test_a_cancelled_request_stops_decoding(engine):
    started = threading.Event()
    tokens = []

    def on_token(index, token, logprob, finish):
        tokens.append(token)
        if len(tokens) == 3:
            started.set()

    long = GenerationRequest(engine.tokenizer("go on")["input_ids"], max_new_tokens=2000, ignore_eos=True,
                             on_token=on_token)
    future = engine.submit(long)
    other = engine.submit(_valid(engine, 5, n=40))
    await asyncio.to_thread(started.wait, 60)
    assert future.cancel()  # what the server does when the client goes away
    result = await asyncio.wrap_future(other)  # the other request is unaffected
    assert len(result.completions[0].token_ids) == 40
    for _ in range(600):
        if not engine.state.running and engine.stats.cancelled_requests == 1:
            break
        await asyncio.sleep(0.05)
    assert engine.stats.cancelled_requests == 1 and not engine.state.running
    passes = engine.stats.decode_passes
    await asyncio.sleep(0.3)
    assert engine.stats.decode_passes == passes  # nothing left running
    assert len(tokens) < 200  # stopped long before its 2000 tokens
    # a queued request cancelled before it ran is dropped too
    with engine.paused():
        queued = engine.submit(_valid(engine, 6))
        assert queued.cancel()
    await asyncio.sleep(0.2)
    assert engine.stats.cancelled_requests == 2 and not engine.state.waiting


def test_seeds_at_the_int64_edges_sample(engine):
    # seeds are int64 (OpenAI's range); choice i of n uses seed + i, computed without overflow
    for seed, n in ((2**63 - 2, 2), (-(2**63), 3)):
        r = engine.submit(GenerationRequest(engine.tokenizer("edge")["input_ids"], max_new_tokens=3, n=n,
                                            ignore_eos=True, sampling=SamplingParams(seed=seed))).result(timeout=60)
        assert [len(c.token_ids) for c in r.completions] == [3] * n


async def test_the_kv_budget_bounds_memory_and_the_context(tiny):
    # tiny: 2 layers x 2 KV heads x 16 dims, fp32, 4 slots -> 2 (K, V) x 2 x 4 x 2 x 16 x 4 = 2048 bytes a token
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    budget = 300 * 1024
    eng = Engine(model, tok, max_batch_size=4, max_kv_bytes=budget)
    try:
        assert eng.kv_bytes_per_token == 2048 and eng.context_length == budget // 2048 - 2 == 148
        prompt = tok("a long story")["input_ids"]
        r = await eng.generate(GenerationRequest(prompt, max_new_tokens=10_000, ignore_eos=True, n=4))
        assert {c.finish_reason for c in r.completions} == {"length"}
        assert all(len(prompt) + len(c.token_ids) <= eng.context_length for c in r.completions)
        assert eng.buffers.nbytes() <= budget
        with pytest.raises(EngineError, match="context length is 148 \\(what the KV cache budget holds"):
            eng.submit(GenerationRequest(list(range(5, 205))))
    finally:
        eng.close()
    with pytest.raises(ValueError, match="max_kv_bytes=4096 holds 0 tokens"):
        Engine(model, tok, max_batch_size=4, max_kv_bytes=4096)
