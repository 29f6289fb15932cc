"""Memory admission of the engine's batches (inference/batch_memory.py): a request is priced (the slot cache
grown for its prompt + max_tokens, the prefill pass) before it is admitted; one that does not fit beside
the running rows waits for them, one that can never fit is refused with what to change, never an
out-of-memory error in the middle of a batch. Through the real engine on a tiny model, and over HTTP."""

from __future__ import annotations

import concurrent.futures

import pytest

from live_bytes import LiveTensorBytes

from groupwise.errors import GroupwiseError, MemoryBudgetError
from groupwise.inference import batch_memory
from groupwise.inference.engine import Engine, GenerationRequest, RequestMemoryError
from groupwise.inference.prefill import run_rows
from groupwise.inference.requests import BASE, RequestState
from groupwise.runtime.compute import compute_thread
from groupwise.runtime.loading import tiny_random_model


def _engine(tiny, **kwargs) -> Engine:
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    return Engine(model, tok, max_batch_size=4, prefix_cache_tokens=0, **kwargs)


def _price(engine: Engine, *requests: GenerationRequest) -> int:
    states = [RequestState(r, concurrent.futures.Future(), r.max_new_tokens) for r in requests]
    return engine.state.price(states).total


def _prompt(n: int, start: int = 5) -> list[int]:
    return [start + (7 * t) % 500 for t in range(n)]


def test_the_price_grows_with_max_tokens_and_counts_every_slot(tiny):
    engine = _engine(tiny)
    try:
        column = engine.state.buffers.column_bytes()
        assert column == 2 * 2 * 4 * 2 * 16 * 4  # keys and values x layers x slots x kv heads x head dim x fp32
        short = engine.state.price([RequestState(GenerationRequest(_prompt(8), max_new_tokens=16),
                                                 concurrent.futures.Future(), 16)])
        long = engine.state.price([RequestState(GenerationRequest(_prompt(8), max_new_tokens=1500),
                                                concurrent.futures.Future(), 1500)])
        assert short.capacity == engine.state.buffers.capacity and short.growth == 0  # fits the initial buffers
        capacity, before = engine.state.buffers.growth_to(8 + 1500 + 1)
        assert long.capacity == capacity >= 8 + 1500 and long.kv == capacity * column
        assert long.growth == before * column > 0  # the old buffers beside the new while they are copied
        assert long.total > short.total + (1500 - 16) * column
        # the prefill of more rows costs more (the price of holding some back)
        many = engine.state.price([RequestState(GenerationRequest(_prompt(200, s)), concurrent.futures.Future(), 16)
                                   for s in range(4)])
        one = engine.state.price([RequestState(GenerationRequest(_prompt(200)), concurrent.futures.Future(), 16)])
        assert many.prefill > 3 * one.prefill
    finally:
        engine.close()


@pytest.mark.parametrize("rows,width", [(4, 600), (2, 2000)])
def test_the_prefill_price_bounds_the_tensors_a_prefill_pass_holds(tiny, rows, width):
    """The price of a prefill pass against the live tensors of a real one (on the engine's compute thread,
    the engine paused): never under them, and not far over (a price far over would hold requests back
    for nothing)."""
    engine = _engine(tiny)
    prompts = [_prompt(width, r) for r in range(rows)]
    try:
        with engine.paused():
            def prefill_pass() -> int:
                engine.state.buffers.grow(width + 1)
                with LiveTensorBytes() as live:
                    run_rows(engine.state, engine.runner, 0, prompts, [0] * rows, [BASE] * rows, logits=True)
                return live.peak
            peak = compute_thread().call(prefill_pass)
        chunk = min(width, max(32, engine.max_prefill_tokens // rows))
        price = engine.state.memory.pass_bytes(rows, chunk, width, repeat_kv=True)
        assert peak > 2**20 and peak <= price <= 2 * peak, (price, peak)
    finally:
        engine.close()


def test_a_request_that_can_never_fit_is_refused_and_the_others_are_served(tiny):
    probe = _engine(tiny)
    fits = _price(probe, GenerationRequest(_prompt(8), max_new_tokens=16))
    never = _price(probe, GenerationRequest(_prompt(8), max_new_tokens=1500))
    probe.close()
    assert fits < never
    engine = _engine(tiny, memory_limit_bytes=(fits + never) // 2)
    try:
        with pytest.raises(RequestMemoryError) as info:
            engine.submit(GenerationRequest(_prompt(8), max_new_tokens=1500))
        assert isinstance(info.value, GroupwiseError) and isinstance(info.value, MemoryBudgetError)
        message = str(info.value)
        for named in ("max_tokens 1500", "max_batch_size", "4 slots", "memory_limit_bytes"):
            assert named in message, named
        futures = [engine.submit(GenerationRequest(_prompt(8, s), max_new_tokens=16)) for s in range(3)]
        results = [f.result(timeout=120) for f in futures]
        assert all(len(r.completions[0].token_ids) >= 1 for r in results)
        assert engine.state.buffers.nbytes() <= (fits + never) // 2
    finally:
        engine.close()


def test_requests_that_do_not_fit_together_wait_and_are_all_served(tiny):
    requests = [GenerationRequest(_prompt(600, s), max_new_tokens=4) for s in range(3)]
    probe = _engine(tiny)
    alone, together = _price(probe, requests[0]), _price(probe, *requests)
    probe.close()
    assert alone < together
    engine = _engine(tiny, memory_limit_bytes=(alone + together) // 2)
    free = _engine(tiny)
    try:
        with engine.paused(), free.paused():  # all queued before the first step, so they could go together
            futures = [e.submit(r) for e in (engine, free) for r in requests]
        results = [f.result(timeout=300) for f in futures]
        limited, unlimited = results[:3], results[3:]
        assert free.stats.prefill_passes == 1  # without a limit, one prefill for the three
        assert engine.stats.prefill_passes >= 2  # held back: fewer at a time
        assert [len(r.completions[0].token_ids) for r in limited] == [len(r.completions[0].token_ids) for r in unlimited]
        assert engine.stats.failed_requests == 0
    finally:
        engine.close()
        free.close()


def test_with_the_device_too_full_an_idle_engine_refuses_instead_of_waiting(tiny, monkeypatch):
    """No limit set: the room is what the device has free. When even one request does not fit an idle
    engine, it is refused at admission (its future fails with what to change), never left waiting."""
    engine = _engine(tiny)
    try:
        small = _price(engine, GenerationRequest(_prompt(8), max_new_tokens=16))
        held = engine.state.held_bytes()
        monkeypatch.setattr(batch_memory, "allocatable_bytes", lambda device: small - held + 1)
        ok = engine.submit(GenerationRequest(_prompt(8), max_new_tokens=16))
        assert len(ok.result(timeout=120).completions[0].token_ids) >= 1
        refused = engine.submit(GenerationRequest(_prompt(8), max_new_tokens=1500))
        with pytest.raises(RequestMemoryError, match="what cpu has free"):
            refused.result(timeout=120)
        assert engine.stats.failed_requests == 1
        after = engine.submit(GenerationRequest(_prompt(8, 9), max_new_tokens=16))  # the engine goes on
        assert len(after.result(timeout=120).completions[0].token_ids) >= 1
    finally:
        engine.close()


async def test_over_http_a_request_that_can_never_fit_gets_a_400_naming_max_tokens(tiny):
    import openai
    from live_server import LiveServer

    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app

    probe = _engine(tiny)
    fits = _price(probe, GenerationRequest(_prompt(40), max_new_tokens=16))
    never = _price(probe, GenerationRequest(_prompt(40), max_new_tokens=1500))
    probe.close()
    engine = _engine(tiny, memory_limit_bytes=(fits + never) // 2)
    try:
        async with LiveServer(create_app(ModelRegistry(engine, base_name="tiny"))) as server:
            client = server.client()
            with pytest.raises(openai.BadRequestError) as info:
                await client.completions.create(model="tiny", prompt="hello there", max_tokens=1500)
            body = info.value.body
            assert body["code"] == "memory_limit_exceeded" and body["param"] == "max_tokens"
            assert "Lower max_tokens" in body["message"]
            served = await client.completions.create(model="tiny", prompt="hello there", max_tokens=8)
            assert served.choices[0].text is not None and served.usage.completion_tokens >= 1
    finally:
        engine.close()
