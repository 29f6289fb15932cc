"""The engine on its own: batching counts, greedy equivalence, seeds, pause, mixed adapters."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import pytest
import torch

from groupwise.inference.engine import Engine, EngineError, GenerationRequest
from groupwise.inference.sampling import SamplingParams, sample_fixed, sample_next, top_p_filter
from groupwise.runtime.loading import tiny_random_model


@pytest.fixture(scope="module")
def engine(tiny):
    model, tok = tiny
    eng = Engine(model, tok, max_batch_size=8, initial_capacity=16)  # small: exercises cache growth
    yield eng
    eng.close()


def prompts(tok, k):
    return [tok.apply_chat_template([{"role": "user", "content": "hi " * (i + 1)}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"] for i in range(k)]


async def test_forward_passes_pinned(engine, tiny):
    # 8 requests x 10 tokens, ignoring EOS, admitted together: 1 prefill pass (gives token 1) + 9 decode
    # passes, where one-at-a-time generation needs 8 x 10 = 80. Submitted inside a pause, so the engine
    # sees all 8 at once (submitted while it runs, the first few could be prefilled alone).
    ps = prompts(tiny[1], 8)
    before = dataclasses.replace(engine.stats)
    async with engine.paused():
        futures = [engine.submit(GenerationRequest(p, max_new_tokens=10, ignore_eos=True, sampling=SamplingParams(seed=i)))
                   for i, p in enumerate(ps)]
    results = await asyncio.gather(*[asyncio.wrap_future(f) for f in futures])
    assert all(len(r.completions[0].token_ids) == 10 for r in results)
    after = engine.stats
    assert (after.prefill_passes - before.prefill_passes, after.decode_passes - before.decode_passes) == (1, 9)
    # a warm pass prefills the prompts' shared prefix once (prefix cache); nothing else runs
    assert after.forward_passes - before.forward_passes == 10 + after.warm_passes - before.warm_passes <= 11
    # the engine's own seconds grew with its passes; off CUDA nothing waits for a device's tokens
    assert after.prefill_s > before.prefill_s and after.decode_s > before.decode_s
    assert after.decode_wait_s == before.decode_wait_s == 0.0


async def test_requests_join_and_leave_at_token_granularity(engine, tiny):
    # 12 requests on 8 slots, different lengths: the last 4 join as soon as slots free up.
    ps = prompts(tiny[1], 12)
    before = engine.stats.forward_passes
    lengths = [3, 20, 5, 7, 2, 9, 4, 6, 8, 3, 5, 4]
    results = await asyncio.gather(*[
        engine.generate(GenerationRequest(p, max_new_tokens=n, ignore_eos=True)) for p, n in zip(ps, lengths)])
    assert [len(r.completions[0].token_ids) for r in results] == lengths
    # Sequential would need sum(lengths) = 76 passes; the batch needs about max(lengths) = 20
    # decode-and-prefill passes plus a few joins.
    assert engine.stats.forward_passes - before <= 30


async def test_greedy_matches_hf_generate_and_cache_growth(engine, tiny):
    model, tok = tiny
    p = prompts(tok, 3)[2]
    r = await engine.generate(GenerationRequest(p, max_new_tokens=40, ignore_eos=True,
                                                sampling=SamplingParams(temperature=0)))
    ref = model.generate(torch.tensor([p]), max_new_tokens=40, min_new_tokens=40, do_sample=False)
    assert r.completions[0].token_ids == ref[0, len(p):].tolist()
    assert engine.buffers.capacity > 16  # it grew past the initial 16 columns


async def test_seeded_sample_does_not_depend_on_batch(engine, tiny):
    ps = prompts(tiny[1], 5)
    req = lambda: GenerationRequest(ps[0], max_new_tokens=12, ignore_eos=True, sampling=SamplingParams(seed=42))
    alone = await engine.generate(req())
    crowd = await asyncio.gather(engine.generate(req()), *[
        engine.generate(GenerationRequest(p, max_new_tokens=12, ignore_eos=True)) for p in ps[1:]])
    assert crowd[0].completions[0].token_ids == alone.completions[0].token_ids


async def test_paused_blocks_forward_passes(engine, tiny):
    p = prompts(tiny[1], 1)[0]
    async with engine.paused():
        before = engine.stats.forward_passes
        future = engine.submit(GenerationRequest(p, max_new_tokens=4))
        await asyncio.sleep(0.3)
        assert engine.stats.forward_passes == before and not future.done()
    result = await asyncio.wrap_future(future)
    assert result.completions[0].token_ids
    with engine.paused():  # the sync form, from another thread than the engine's
        assert engine.stats.forward_passes >= before + 1


async def test_an_idle_pause_frees_the_kv_and_prefix_memory_and_restores_it(tiny):
    # The trainer runs inside a pause: the slot KV and the prefix pool are freed for it
    # (the update is the run's memory peak) and come back, at the same capacity, when it ends.
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=4, initial_capacity=32)
    try:
        p = prompts(tok, 2)[1]
        req = lambda: GenerationRequest(p, max_new_tokens=8, ignore_eos=True, sampling=SamplingParams(seed=7))
        before = await eng.generate(req())
        capacity, kv_bytes = eng.buffers.capacity, eng.buffers.nbytes()
        assert kv_bytes > 0 and eng.prefix_cache.nbytes() > 0
        async with eng.paused():
            assert eng.buffers.nbytes() == 0 and eng.prefix_cache.nbytes() == 0
            async with eng.paused():  # nested pauses: the inner end restores nothing yet
                pass
            assert eng.buffers.nbytes() == 0
        assert (eng.buffers.capacity, eng.buffers.nbytes()) == (capacity, kv_bytes)
        after = await eng.generate(req())
        assert after.completions[0].token_ids == before.completions[0].token_ids
        # a pause with a sequence in its slot keeps everything (its KV is live)
        future = eng.submit(GenerationRequest(p, max_new_tokens=200, ignore_eos=True))
        while not eng.state.running:
            await asyncio.sleep(0.01)
        async with eng.paused():
            assert eng.buffers.nbytes() == kv_bytes or eng.buffers.capacity > capacity
        assert len((await asyncio.wrap_future(future)).completions[0].token_ids) == 200
    finally:
        eng.close()
    kept = Engine(model, tok, max_batch_size=4, initial_capacity=32, release_when_idle=False)
    try:
        await kept.generate(req())
        kv_bytes = kept.buffers.nbytes()
        async with kept.paused():  # asked to keep them: nothing is freed
            assert kept.buffers.nbytes() == kv_bytes > 0 and kept.prefix_cache.nbytes() > 0
    finally:
        kept.close()


async def test_adapter_can_be_loaded_inside_a_pause(tiny, adapter_dirs):
    # The trainer saves a step and loads it while it still holds the pause: no deadlock.
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=2)
    try:
        async with eng.paused():
            eng.add_adapter("step-1", adapter_dirs[1])
            future = eng.submit(GenerationRequest(prompts(tok, 1)[0], max_new_tokens=2, adapter="step-1"))
            await asyncio.sleep(0.2)
            assert eng.stats.forward_passes == 0 and not future.done()
        assert len((await asyncio.wrap_future(future)).completions[0].token_ids) >= 1
    finally:
        eng.close()


async def test_a_pause_leaves_every_module_in_eval_mode(tiny, adapter_dirs):
    """A trainer that switched the shared model to train mode inside a pause (dropout on) finds every module
    in eval mode after it, the slots' modules included, and a new slot's modules start in eval mode too:
    the engine writes the flags on its cached module list instead of nn.Module.eval's recursion."""
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=2)
    try:
        eng.add_adapter("step-1", adapter_dirs[1])
        assert not any(m.training for m in eng.model.modules())
        async with eng.paused():
            eng.model.train()
            assert all(m.training for m in eng.model.modules())
        assert not any(m.training for m in eng.model.modules())
        eng.model.train()
        eng.add_adapter("step-2", adapter_dirs[2])  # a new slot: a new module walk, every flag written
        assert not any(m.training for m in eng.model.modules())
    finally:
        eng.close()


async def test_mixed_adapter_batch_equals_separate_runs(tiny, adapter_dirs):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=8)
    try:
        eng.add_adapter("a1", adapter_dirs[1])
        eng.add_adapter("a2", adapter_dirs[2])
        assert eng.adapters() == ["a1", "a2"]
        p = prompts(tok, 1)[0]
        req = lambda a: GenerationRequest(p, max_new_tokens=8, ignore_eos=True, adapter=a,
                                          sampling=SamplingParams(temperature=0))
        mixed = await asyncio.gather(*[eng.generate(req(a)) for a in (None, "a1", "a2")])
        alone = [await eng.generate(req(a)) for a in (None, "a1", "a2")]
        assert [m.completions[0].token_ids for m in mixed] == [a.completions[0].token_ids for a in alone]
        for m, a in zip(mixed, alone):
            assert max(abs(x - y) for x, y in zip(m.completions[0].logprobs, a.completions[0].logprobs)) < 1e-4
        with pytest.raises(EngineError, match="not loaded"):
            eng.submit(req("a3"))
        eng.remove_adapter("a1")
        assert eng.adapters() == ["a2"]
    finally:
        eng.close()


def test_top_p_filter_keeps_smallest_set():
    # probs [0.5, 0.3, 0.2]: top_p 0.6 keeps {0.5, 0.3} (0.5 < 0.6, so the 2nd is needed); 0.5 keeps {0.5}.
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]]))
    out = top_p_filter(logits, torch.tensor([0.6, 0.5]))
    assert torch.isinf(out).tolist() == [[False, False, True], [True, True, False]]


def test_closed_engine_refuses(tiny):
    model, tok = tiny
    eng = Engine(model, tok, max_batch_size=2)
    eng.close()
    with pytest.raises(EngineError, match="closed"):
        eng.submit(GenerationRequest([1, 2, 3]))


async def test_closing_an_engine_releases_its_graphs(tiny):
    # Not left to the garbage collector, which could free them inside another engine's capture
    # (decode_graphs.py); off CUDA the graphs are their eager stand-ins, kept the same way.
    model, tok = tiny
    eng = Engine(model, tok, max_batch_size=2, cuda_graphs=True)
    try:
        await eng.generate(GenerationRequest(prompts(tok, 1)[0], max_new_tokens=4, ignore_eos=True))
        assert eng.runner.graphs
    finally:
        eng.close()
    assert not eng.runner.graphs


def test_seeded_noise_is_uniform_and_sampling_matches_probabilities():
    from groupwise.inference.sampling import sample_next, seeded_uniform

    seeds, steps = torch.arange(50000) // 10, torch.arange(50000) % 10
    u = seeded_uniform(seeds, steps)
    assert 0.0 < u.min() and u.max() < 1.0
    # uniform on (0, 1): mean 1/2, variance 1/12
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.005
    assert len(set(u.tolist())) > 49000  # no structure: (seed, step) pairs give distinct draws
    assert torch.equal(u, seeded_uniform(seeds, steps))
    # probs [0.7, 0.2, 0.1]: over 4000 seeds the empirical frequencies are within 0.03 of them.
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).repeat(4000, 1)
    params = [SamplingParams(seed=s) for s in range(4000)]
    tokens, logprobs, _ = sample_next(logits, params, list(range(4000)), [0] * 4000)
    freq = torch.bincount(tokens, minlength=3).float() / 4000
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.03)
    assert torch.allclose(logprobs, torch.log(torch.tensor([0.7, 0.2, 0.1]))[tokens])


def test_fixed_shape_sampling_draws_the_same_tokens_as_sample_next():
    # The CUDA graph samples with sample_fixed; the eager path with sample_next. Same uniforms
    # (seeded rows), same temperatures (0 = greedy) -> the same tokens and the raw logprob.
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(5, 300, generator=g) * 3
    temps, steps = [1.0, 0.0, 0.7, 1.3, 1.0], [0, 4, 9, 2, 17]
    params = [SamplingParams(temperature=t, seed=10 + i) for i, t in enumerate(temps)]
    tok_a, lp_a, _ = sample_next(logits, params, [p.seed for p in params], steps)
    tok_b, lp_b = sample_fixed(logits, torch.tensor(temps), torch.tensor([p.seed for p in params]), torch.tensor(steps))
    assert torch.equal(tok_a, tok_b)
    torch.testing.assert_close(lp_b, torch.log_softmax(logits, -1)[torch.arange(5), tok_b], atol=1e-6, rtol=0)
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)
    assert tok_b[1] == logits[1].argmax()


async def test_graph_decode_path_matches_eager(tiny, adapter_dirs):
    # cuda_graphs=True off CUDA runs the graph path's static buffers, batch/length buckets and padding
    # rows eagerly (decode_graphs.EagerReplay): it must give the same tokens as the plain eager decode.
    outs = []
    for graphs in (False, True):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
        eng = Engine(model, tok, max_batch_size=8, initial_capacity=16, cuda_graphs=graphs)
        try:
            eng.add_adapter("a1", adapter_dirs[1])
            ps = prompts(tok, 5)
            uniform = await asyncio.gather(*[eng.generate(GenerationRequest(
                p, max_new_tokens=6 + 3 * i, ignore_eos=True, adapter="a1", sampling=SamplingParams(seed=i)))
                for i, p in enumerate(ps)])
            base = await asyncio.gather(*[eng.generate(GenerationRequest(
                p, max_new_tokens=7, ignore_eos=True, sampling=SamplingParams(temperature=0))) for p in ps[:3]])
            outs.append([r.completions[0].token_ids for r in uniform + base])
            if graphs:
                # buckets seen: batch 8 (5 rows padded to 8), 4, 2, 1 as rows finish; lengths round to 64
                assert {k[0] for k in eng.runner.graphs} >= {8, 4, 2, 1}
                # a slot adapter's rows replay the stacked graph (one set of graphs for every slot), the
                # base's its own
                assert {k[2] for k in eng.runner.graphs} == {"__mixed__", "__base__"}
        finally:
            eng.close()
    assert outs[0] == outs[1]


async def test_serving_leaves_the_trainers_adapter_trainable(tiny, adapter_dirs):
    # The backend shares one PeftModel: a trainable adapter + served steps. (peft refuses the name
    # "train": it clashes with nn.Module.train inside peft's ModuleDicts.) Serving, on the
    # graph path too, must not change which adapter is active nor any requires_grad.
    from peft import LoraConfig, get_peft_model

    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]), adapter_name="policy")
    peft_model.eval()
    before = {n: p.requires_grad for n, p in peft_model.named_parameters()}
    eng = Engine(peft_model, tok, max_batch_size=4, cuda_graphs=True)
    try:
        eng.add_adapter("step-1", adapter_dirs[1])
        p = prompts(tok, 1)[0]
        for adapter in ("step-1", None, "policy"):
            await eng.generate(GenerationRequest(p, max_new_tokens=3, adapter=adapter))
        assert peft_model.active_adapter == "policy"
        after = {n: p.requires_grad for n, p in peft_model.named_parameters() if n in before}
        # (o_proj was wrapped by the served adapter, so its base weight changed name; compare the rest)
        assert after == {n: before[n] for n in after} and len(after) >= len(before) - 2
        assert [n for n, g in after.items() if g] == [n for n, g in before.items() if g and n in after]
        assert any(after.values())
    finally:
        eng.close()


async def test_chunked_prefill_equals_one_pass(tiny):
    # max_prefill_tokens=64 with 2 prompts -> chunks of 32 queries: a 75-token prompt takes 3 passes.
    model, tok = tiny
    ps = [tok("word " * 70)["input_ids"] + [1, 2, 3, 4, 5], tok("short prompt")["input_ids"]]
    outs = []
    for budget in (64, 8192):
        eng = Engine(model, tok, max_batch_size=4, max_prefill_tokens=budget)
        try:
            futures = [eng.submit(GenerationRequest(p, max_new_tokens=6, ignore_eos=True,
                                                    sampling=SamplingParams(temperature=0))) for p in ps]
            rs = [f.result(timeout=120) for f in futures]
            outs.append([(r.completions[0].token_ids, r.completions[0].logprobs) for r in rs])
        finally:
            eng.close()
    for (ids_a, lp_a), (ids_b, lp_b) in zip(*outs):
        assert ids_a == ids_b and max(abs(x - y) for x, y in zip(lp_a, lp_b)) < 1e-4


async def test_a_failing_prefill_answers_its_callers(tiny):
    # Admitted requests sit in neither queue until placed; an error in their prefill must still reach them.
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=4)
    try:
        def boom(*args, **kwargs):
            raise RuntimeError("boom in the forward pass")

        eng.runner.forward = boom
        with pytest.raises(EngineError, match="boom in the forward pass"):
            await asyncio.wait_for(eng.generate(GenerationRequest([1, 2, 3], max_new_tokens=2)), 60)
    finally:
        eng.close()


async def test_a_paused_engine_with_requests_stops_its_callers_rollout_clock(engine, tiny):
    # rollout/stalls.py: while a trainer holds the model, requests in flight wait through no fault of
    # their rollouts; the engine says so, and the rollout clock stands still. Idle or serving, it runs.
    from groupwise.rollout.stalls import STALLS

    before = STALLS.seconds()
    async with engine.paused():
        await asyncio.sleep(0.05)
        assert STALLS.seconds() == before  # paused, nothing asked of it: no caller waits
        future = engine.submit(GenerationRequest(prompts(tiny[1], 1)[0], max_new_tokens=2,
                                                 sampling=SamplingParams(seed=0)))
        await asyncio.sleep(0.2)
        assert STALLS.seconds() - before >= 0.15  # a request waits on the pause (0.2 s)
    await asyncio.wrap_future(future)
    settled = STALLS.seconds()
    await asyncio.sleep(0.1)
    assert STALLS.seconds() == settled  # served: the clock runs again


def test_a_gpu_releases_its_idle_caches_by_default_only_under_memory_pressure(monkeypatch):
    # Freeing the KV on CUDA drops the decode graphs, which are then captured again (16-22% of the tokens/s
    # of 4 small runs on one GPU), so by default only a device short of memory pays that. The device's
    # readings are the seam: this machine has no GPU.
    from groupwise.runtime import memory

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: type("P", (), {"total_memory": 80 * gib}))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(memory, "allocatable_bytes", lambda device: 30 * gib)
    assert not memory.memory_pressed(cuda)
    monkeypatch.setattr(memory, "allocatable_bytes", lambda device: 12 * gib)  # under a quarter of 80
    assert memory.memory_pressed(cuda)
    monkeypatch.setattr(memory, "allocatable_bytes", lambda device: None)  # unreadable: no release
    assert not memory.memory_pressed(cuda)
    assert not memory.memory_pressed(torch.device("cpu"))  # the CPU releases by its own rule
