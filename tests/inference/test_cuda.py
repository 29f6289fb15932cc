"""CUDA only: captured CUDA graphs decode exactly like eager decode; bf16 logprobs stay close to a forward pass."""

from __future__ import annotations

import asyncio

import pytest
import torch

from groupwise.inference import decode_graphs
from groupwise.inference.decode_graphs import release_rng_capture
from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model

# skipif (not pytest.skip inside the test) so the fixtures are not built on CPU-only machines.
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA device (the lead runs these on the GPU machine)")]


async def test_cuda_graph_decode_equals_eager(tiny, adapter_dirs):
    # graphs as the model runs, and with their norms, rotary and sampling compiled (decode_fusion.py)
    outs = []
    for graphs, fuse in ((False, False), (True, False), (True, True)):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1], device="cuda", dtype="float32")
        eng = Engine(model, tok, max_batch_size=8, cuda_graphs=graphs, fuse_decode=fuse)
        try:
            eng.add_adapter("a1", adapter_dirs[1])
            ps = [tok.apply_chat_template([{"role": "user", "content": "hi " * (i + 1)}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"] for i in range(6)]
            rs = await asyncio.gather(*[eng.generate(GenerationRequest(
                p, max_new_tokens=5 + 4 * i, ignore_eos=True, adapter="a1" if i % 2 else None,
                sampling=SamplingParams(seed=i))) for i, p in enumerate(ps)])
            rs += await asyncio.gather(*[eng.generate(GenerationRequest(
                p, max_new_tokens=9, ignore_eos=True, adapter="a1", sampling=SamplingParams(temperature=0)))
                for p in ps[:3]])
            outs.append([r.completions[0].token_ids for r in rs])
            if graphs:
                assert eng.cuda_graphs, "graph capture failed and the engine fell back to eager"
                assert eng.runner.graphs, "no graph was captured"
                assert not fuse or eng.runner.fusion.enabled, "compiling the fused pieces failed"
        finally:
            eng.close()
    assert outs[0] == outs[1] == outs[2]


async def test_bf16_logprobs_close_to_forward(tiny):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1], device="cuda", dtype="bfloat16")
    eng = Engine(model, tok, max_batch_size=4)
    try:
        p = tok.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                    tokenize=True, return_dict=True)["input_ids"]
        r = await eng.generate(GenerationRequest(p, max_new_tokens=16, ignore_eos=True, sampling=SamplingParams(seed=0)))
        ids = r.completions[0].token_ids
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([p + ids], device="cuda")).logits.float(), -1)[0]
        ref = logp[len(p) - 1 : -1].gather(1, torch.tensor(ids, device="cuda")[:, None])[:, 0].cpu()
        assert (ref - torch.tensor(r.completions[0].logprobs)).abs().max().item() < 0.05  # bf16 noise
    finally:
        eng.close()


async def test_graphs_replayed_after_other_allocations_still_decode_like_eager(tiny):
    """Graphs read their inputs by address: every tensor a capture used must outlive the graph.

    Regression: the cache view's row index was freed after capture; the next allocations of its size
    took its memory, and a replay scattered K/V with those values as indices (device-side assert).
    Between rounds we fill the allocator's free blocks with huge int64 values, so a dangling index
    is out of bounds at once instead of by luck.
    """
    outs = []
    for graphs in (False, True):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1], device="cuda", dtype="float32")
        eng = Engine(model, tok, max_batch_size=16, cuda_graphs=graphs)
        ps = [tok.apply_chat_template([{"role": "user", "content": "x " * (i + 1)}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"] for i in range(16)]
        tokens = []
        try:
            for round_ in range(3):
                rs = await asyncio.gather(*[eng.generate(GenerationRequest(
                    p, max_new_tokens=6 + (i % 5), ignore_eos=True, sampling=SamplingParams(seed=100 * round_ + i)))
                    for i, p in enumerate(ps)])
                tokens.append([r.completions[0].token_ids for r in rs])
                junk = [torch.full((b, 1), 2**40, dtype=torch.long, device="cuda") for b in (1, 2, 4, 8, 16) for _ in range(8)]
                del junk  # freed: the next allocations of these sizes reuse the poisoned blocks
            if graphs:
                assert eng.cuda_graphs and eng.runner.graphs, "the engine fell back to eager decoding"
        finally:
            eng.close()
        outs.append(tokens)
    assert outs[0] == outs[1]


async def test_an_idle_pause_frees_the_kv_and_its_graphs_and_decoding_after_it_is_unchanged(tiny):
    # A pause with nothing in flight frees the slot KV, the prefix pool and the decode graphs (which read
    # the KV by address) for the trainer (by default only under memory pressure on CUDA; asked for here);
    # after it the same request decodes the same tokens, on graphs captured again over the new buffers.
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1], device="cuda", dtype="float32")
    eng = Engine(model, tok, max_batch_size=8, release_when_idle=True)
    try:
        p = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
                                    return_dict=True)["input_ids"]
        req = lambda: GenerationRequest(p, max_new_tokens=40, n=4, ignore_eos=True, sampling=SamplingParams(seed=3))
        before = await eng.generate(req())
        assert eng.runner.graphs and eng.buffers.nbytes() > 0
        allocated = torch.cuda.memory_allocated()
        async with eng.paused():
            assert not eng.runner.graphs and eng.buffers.nbytes() == 0
            assert torch.cuda.memory_allocated() < allocated
        after = await eng.generate(req())
        assert eng.runner.graphs and eng.cuda_graphs
    finally:
        eng.close()
    assert [c.token_ids for c in after.completions] == [c.token_ids for c in before.completions]


def _random_op_fails(device: torch.device) -> bool:
    try:
        torch.randn(4, device=device)
    except RuntimeError as exc:
        assert "graph capture" in str(exc), exc
        return True
    return False


def test_a_failed_capture_leaves_random_ops_working():
    # torch marks the default generator as capturing at a capture's start and unmarks it only when the
    # capture ends well: after a failed one, every random op of the process fails. This is torch's
    # behaviour the engine guards against (decode_graphs.release_rng_capture).
    dev = torch.device("cuda")
    x = torch.ones(1, device=dev)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError):
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            x.item()  # a read-back cannot be captured
    assert _random_op_fails(dev), "torch no longer leaves its generator marked after a failed capture"
    release_rng_capture(dev)
    assert not _random_op_fails(dev)
    seed = torch.cuda.initial_seed()
    torch.cuda.manual_seed(seed)
    a = torch.randn(8, device=dev)
    torch.cuda.manual_seed(seed)
    assert torch.equal(a, torch.randn(8, device=dev))  # the generator seeds and draws as before


@pytest.mark.filterwarnings("ignore:CUDA graph capture failed")
async def test_an_engine_whose_capture_fails_decodes_eagerly_and_the_process_can_still_build_models(tiny, monkeypatch):
    # A decode step that cannot be captured: the engine warns and decodes eagerly, and the process's next
    # model (its initialisation draws random numbers) still builds: the failed capture does not leave the
    # default generator marked (the sequence case of bench/many_runs.py failed that way, at its next run).
    real = decode_graphs.sample_fixed

    def uncapturable(logits, *args, **kwargs):
        logits.sum().item()  # a read-back: the capture fails
        return real(logits, *args, **kwargs)

    monkeypatch.setattr(decode_graphs, "sample_fixed", uncapturable)
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1], device="cuda", dtype="float32")
    eng = Engine(model, tok, max_batch_size=4, cuda_graphs=True, fuse_decode=False)  # the unfused step's sampling
    p = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
                                return_dict=True)["input_ids"]
    try:
        r = await eng.generate(GenerationRequest(p, max_new_tokens=8, ignore_eos=True, sampling=SamplingParams(seed=1)))
        assert len(r.completions[0].token_ids) == 8 and not eng.cuda_graphs
    finally:
        eng.close()
    assert not _random_op_fails(torch.device("cuda"))
    tiny_random_model(seed=1, tokenizer=tiny[1], device="cuda", dtype="float32")


async def test_a_collection_during_capture_cannot_destroy_another_graph_there(tiny):
    # An earlier engine's graph left in an unreachable cycle. The automatic collector is held back
    # (a huge threshold) so the cycle lives until the capture, and a hook on the model stands in for
    # it: inside a capture it collects whenever collection is enabled, as the collector would at any
    # allocation. Before the capture ran with collection off, that freed the old graph inside the
    # capture and the capture failed (the engine then decoded eagerly for good).
    import gc

    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1], device="cuda", dtype="float32")
    static = torch.zeros(4, device="cuda")
    old = torch.cuda.CUDAGraph()
    with torch.cuda.graph(old):
        static.add_(1)
    collections = []

    def collector(module, args):
        if torch.cuda.is_current_stream_capturing() and gc.isenabled():
            collections.append(gc.collect())

    thresholds = gc.get_threshold()
    gc.set_threshold(10**9)
    hook = model.register_forward_pre_hook(collector)
    try:
        cycle: list = [old]
        cycle.append(cycle)
        del old, cycle
        eng = Engine(model, tok, max_batch_size=4, cuda_graphs=True)
        try:
            p = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
            await eng.generate(GenerationRequest(p, max_new_tokens=6, ignore_eos=True, sampling=SamplingParams(seed=0)))
            assert eng.cuda_graphs and eng.runner.graphs, "the capture failed and the engine fell back to eager"
            assert collections == []  # no collection ran inside a capture
        finally:
            eng.close()
    finally:
        hook.remove()
        gc.set_threshold(*thresholds)
        gc.collect()
    assert not eng.runner.graphs  # closing released them, outside any capture


async def test_copies_cached_to_their_last_token_decode_it_in_graphs_launched_ahead_as_eager(tiny, adapter_dirs):
    # A GRPO-like admission (prefill.pending_last_token): four copies of each of two prompts, one on an adapter,
    # seeded, one copy asking n=2, plus a lone prompt. With graphs the copies skip the prefill forward and their first
    # decode step, launched ahead of the host (decode_graphs.run_decode_steps, CUDA only), computes the last prompt
    # token; every choice is the eager engine's, where each row runs the prefill forward.
    outs, prefills, tokens = [], [], []
    for graphs in (False, True):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1], device="cuda", dtype="float32")
        eng = Engine(model, tok, max_batch_size=16, cuda_graphs=graphs)
        try:
            eng.add_adapter("a1", adapter_dirs[1])
            groups = [tok.apply_chat_template([{"role": "user", "content": f"question {g}: " + "and more " * 8}],
                                              add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
                      for g in range(2)]
            requests = [GenerationRequest(p, max_new_tokens=6, ignore_eos=True, adapter="a1" if g else None,
                                          n=2 if (g, i) == (1, 3) else 1, sampling=SamplingParams(seed=10 * g + i))
                        for g, p in enumerate(groups) for i in range(4)]
            requests.append(GenerationRequest(list(range(900, 930)), max_new_tokens=6, ignore_eos=True,
                                              sampling=SamplingParams(temperature=0)))
            async with eng.paused():  # one admission
                futures = [eng.submit(r) for r in requests]
            rs = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
            outs.append([[c.token_ids for c in r.completions] for r in rs])
            prefills.append(eng.stats.prefill_passes)
            tokens.append(eng.stats.prefill_tokens)
            if graphs:
                assert eng.cuda_graphs and eng.runner.graphs, "graph capture failed and the engine fell back to eager"
        finally:
            eng.close()
    assert outs[0] == outs[1]
    assert prefills == [1, 1]  # the lone prompt's forward; the copies' last tokens ran in it (eager) or in decode
    assert tokens[1] == tokens[0] - 8  # the eight copies' last prompt tokens: not in a prefill with graphs
