"""The engine beside a trainer's update (`Engine.paused(decoding=True)`): the running requests go on by replays
of decode graphs captured before, and nothing else runs (no prefill, capture or eager pass, which would run
the modules the trainer sets); the tokens are those of an engine that never paused. Off CUDA the graphs are
their eager stand-ins (decode_graphs.EagerReplay), which test the scheduling here; that they run beside a
real update on CUDA is tests/training/test_update_beside_decoding.py."""

from __future__ import annotations

import asyncio

import pytest

from groupwise.errors import ConfigError
from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model


def _prompts(tok, k):
    return [tok.apply_chat_template([{"role": "user", "content": "hi " * (i + 1)}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"] for i in range(k)]


def _requests(tok, seed: int, k: int = 4, new: int = 90) -> list[GenerationRequest]:
    return [GenerationRequest(p, max_new_tokens=new, ignore_eos=True, adapter="a1", sampling=SamplingParams(seed=seed + i))
            for i, p in enumerate(_prompts(tok, k))]


def _engine(tiny, adapter_dirs, **kwargs) -> Engine:
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    # initial_capacity holds every length here: a growth would drop the graphs
    eng = Engine(model, tok, max_batch_size=8, initial_capacity=256, cuda_graphs=True, fuse_decode=False,
                 decode_during_updates=True, **kwargs)
    eng.add_adapter("a1", adapter_dirs[1])
    return eng


async def _running(eng: Engine, rows: int, tokens: int = 2) -> None:
    """Wait until `rows` rows decode, each with `tokens` generated."""
    for _ in range(20_000):
        running = list(eng.state.running)
        if len(running) == rows and all(len(s.tokens) >= tokens for s in running):
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the requests never ran")


def _tokens(results) -> list[list[int]]:
    return [c.token_ids for r in results for c in r.completions]


async def test_running_requests_decode_through_an_update_and_new_ones_wait_for_its_end(tiny, adapter_dirs):
    eng = _engine(tiny, adapter_dirs)
    tok = eng.tokenizer
    try:
        await asyncio.gather(*[eng.generate(r) for r in _requests(tok, 100)])  # captures every bucket of these shapes
        reference = _tokens(await asyncio.gather(*[eng.generate(r) for r in _requests(tok, 0)]))
        captures = eng.stats.graph_captures
        tasks = [asyncio.ensure_future(eng.generate(r)) for r in _requests(tok, 0)]
        await _running(eng, 4)
        async with eng.paused(decoding=True):
            prefills, passes = eng.stats.prefill_passes, eng.stats.forward_passes
            late = asyncio.ensure_future(eng.generate(GenerationRequest(_prompts(tok, 1)[0], max_new_tokens=5)))
            results = await asyncio.wait_for(asyncio.gather(*tasks), 120)  # they finish during the update
            await asyncio.sleep(0.05)
            assert not late.done() and not eng.state.running
            assert eng.stats.prefill_passes == prefills and eng.stats.graph_captures == captures
            assert eng.stats.forward_passes > passes and eng.stats.decode_s_in_updates > 0
        assert len((await asyncio.wait_for(late, 60)).completions[0].token_ids) == 5  # admitted after it
        assert eng.stats.prefill_passes > prefills
    finally:
        eng.close()
    assert _tokens(results) == reference


async def test_a_step_that_needs_a_capture_waits_for_the_update_to_end(tiny, adapter_dirs):
    warm = _engine(tiny, adapter_dirs)
    tok = warm.tokenizer
    try:
        reference = _tokens(await asyncio.gather(*[warm.generate(r) for r in _requests(tok, 0)]))
    finally:
        warm.close()
    eng = _engine(tiny, adapter_dirs)  # nothing captured: the rows pass the 64-column bucket during the update
    try:
        tasks = [asyncio.ensure_future(eng.generate(r)) for r in _requests(tok, 0)]
        await _running(eng, 4)
        async with eng.paused(decoding=True):
            captures = eng.stats.graph_captures
            for _ in range(20_000):
                if eng.state.replays_blocked:
                    break
                await asyncio.sleep(0.001)
            assert eng.state.replays_blocked and len(eng.state.running) == 4
            assert max(s.length for s in eng.state.running) + 1 > 64  # its graph would be a capture
            await asyncio.sleep(0.05)
            assert eng.stats.graph_captures == captures and not any(t.done() for t in tasks)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
        assert eng.stats.graph_captures > captures
    finally:
        eng.close()
    assert _tokens(results) == reference


async def test_a_new_adapter_slot_waits_for_the_update_and_a_refilled_one_does_not(tiny, adapter_dirs):
    # A new slot adds modules to the model the trainer runs, and sets them all to eval mode; a free slot of
    # the same shape is only a copy into the slot's own tensors. (release_when_idle=False: an idle engine would
    # give its memory to the update and pause whole)
    eng = _engine(tiny, adapter_dirs, release_when_idle=False)
    try:
        async with eng.paused(decoding=True):
            await asyncio.to_thread(eng.remove_adapter, "a1")
            await asyncio.wait_for(asyncio.to_thread(eng.add_adapter, "a2", adapter_dirs[2]), 60)
            new_slot = asyncio.ensure_future(asyncio.to_thread(eng.add_adapter, "a3", adapter_dirs[3]))
            await asyncio.sleep(0.3)
            assert not new_slot.done() and "a3" not in eng.adapters()
        await asyncio.wait_for(new_slot, 60)
        assert {"a2", "a3"} <= set(eng.adapters())
    finally:
        eng.close()


async def test_an_idle_engine_whose_memory_the_update_wants_pauses_whole(tiny, adapter_dirs):
    # (release_when_idle=True: as under memory pressure) idle, its KV goes to the update, so nothing could decode;
    # with rows in flight it keeps its KV and decodes them
    eng = _engine(tiny, adapter_dirs, release_when_idle=True)
    tok = eng.tokenizer
    try:
        pause = eng.paused(decoding=True)
        async with pause:
            assert eng.buffers.nbytes() == 0 and eng.state.pauses == 1 and not eng.state.replays_only
        assert not pause.decoding
        tasks = [asyncio.ensure_future(eng.generate(r)) for r in _requests(tok, 0, k=2)]
        await _running(eng, 2)
        pause = eng.paused(decoding=True)
        async with pause:
            assert eng.buffers.nbytes() > 0 and eng.state.replays_only == 1 and not eng.state.pauses
        assert pause.decoding
        await asyncio.wait_for(asyncio.gather(*tasks), 120)
    finally:
        eng.close()


def test_decoding_during_updates_needs_graphs(tiny):
    model, tok = tiny
    with pytest.raises(ConfigError, match="needs cuda_graphs"):
        Engine(model, tok, cuda_graphs=False, decode_during_updates=True)
    eng = Engine(model, tok, max_batch_size=2)  # CPU: no graphs, so a decoding pause is a whole one
    try:
        assert not eng.decode_during_updates and not eng.paused(decoding=True).decoding
    finally:
        eng.close()
