"""The prefix cache (prefix_cache.py), the warm-up pass for a batch's shared prefix (prefill.py), and
the two-level inverse CDF of the sampler: each against the plain path it replaces."""

from __future__ import annotations

import pytest
import torch

from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.kv_cache import SlotBuffers
from groupwise.inference.prefill import MIN_WARM_GAIN, plan_warm
from groupwise.inference.prefix_cache import PrefixCache
from groupwise.inference.sampling import SamplingParams, inverse_cdf
from groupwise.runtime.loading import tiny_random_model

SHARED = list(range(1000, 1050))  # a 50-token "system prompt"


def greedy(p, n=8, adapter=None):
    return GenerationRequest(p, max_new_tokens=n, ignore_eos=True, adapter=adapter, sampling=SamplingParams(temperature=0))


def close(a, b):
    """Same tokens, logprobs within 1e-4 (fp32: the cached KV came from another batch shape)."""
    ca, cb = a.completions[0], b.completions[0]
    return ca.token_ids == cb.token_ids and max(abs(x - y) for x, y in zip(ca.logprobs, cb.logprobs)) < 1e-4


KEEPER = [5, 6, 7]  # shares no token with SHARED: no effect on the counts below
CLOSER = [2]  # one token: a prefix hit stops one short of a prompt, so it can hit nothing


class busy:
    """Keep the engine busy with one long request: an idle engine forgets its prefixes (engine.py)."""

    def __init__(self, eng):
        self.eng = eng

    def __enter__(self):
        # Long enough to outlast the test's own work (adapter loads from disk included) at any
        # engine speed: the tiny model's context (2048) caps it. Cancelled at exit, not waited out.
        self.future = self.eng.submit(GenerationRequest(KEEPER, max_new_tokens=2000, ignore_eos=True))
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            assert not self.future.done(), "the keeper finished early: the engine went idle in between"
        self.future.cancel()
        # the engine retires the keeper at its next step; a last request of one token is then alone, and an
        # engine left idle forgets its prefixes before its caller hears back (what run_both checks)
        self.eng.submit(GenerationRequest(CLOSER, max_new_tokens=1, ignore_eos=True)).result(timeout=300)


async def run_both(tiny, requests_in_order, **kwargs):
    """Run the same requests, one after another, on an engine with and one without the cache."""
    outs, engines = [], []
    for tokens in (4096, 0):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
        eng = Engine(model, tok, max_batch_size=8, prefix_cache_tokens=tokens, prefix_block_size=16, **kwargs)
        try:
            with busy(eng):
                outs.append([await eng.generate(r) for r in requests_in_order])
            assert eng.prefix_cache is None or len(eng.prefix_cache) == 0  # idle again: forgotten
        finally:
            eng.close()
        engines.append(eng)
    return outs, engines


async def test_hit_equals_cold_prefill_and_counts_saved_tokens(tiny):
    a, b, c = SHARED + [7, 8, 9], SHARED + [10, 11], SHARED[:20] + [12]
    (warm, cold), (eng, ref) = await run_both(tiny, [greedy(a), greedy(b), greedy(c), greedy(b)])
    assert all(close(x, y) for x, y in zip(warm, cold))
    # a: cold, 53 prompt tokens run. b shares 50 with a (3 full blocks + 2 tokens of the partial 4th):
    # 2 run. c shares 20: 1 run. b again: 50 + its own tail "10" (the hit stops 1 short): 1 run.
    assert eng.stats.prefix_hit_tokens == 0 + 50 + 20 + 51
    assert eng.stats.prefill_tokens == len(KEEPER) + 53 + 2 + 1 + 1 + len(CLOSER)
    assert ref.stats.prefix_hit_tokens == 0
    assert ref.stats.prefill_tokens == len(KEEPER) + 53 + 52 + 21 + 52 + len(CLOSER)


async def test_batch_sharing_a_prefix_runs_it_once(tiny):
    # 4 requests admitted together on a cold cache: the warm pass prefills the 50 shared tokens of one
    # (50 - 0 saved for 3 others = 150 >= MIN_WARM_GAIN), then each row runs only its own tail.
    prompts = [SHARED + [20 + i, 30 + i] for i in range(4)]
    outs = []
    for tokens in (4096, 0):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
        eng = Engine(model, tok, max_batch_size=8, prefix_cache_tokens=tokens)
        try:
            with eng.paused():  # queue all four: one admission
                futures = [eng.submit(greedy(p)) for p in prompts]
            outs.append([f.result(timeout=120) for f in futures])
            if tokens:
                assert (eng.stats.warm_passes, eng.stats.prefill_passes) == (1, 1)
                assert eng.stats.prefill_tokens == 50 + 4 * 2 and eng.stats.prefix_hit_tokens == 4 * 50
                assert eng.stats.forward_passes == 1 + 1 + 7  # warm + prefill (token 1) + 7 decodes
            else:
                assert eng.stats.warm_passes == 0 and eng.stats.prefill_tokens == 4 * 52
        finally:
            eng.close()
    assert all(close(x, y) for x, y in zip(*outs))


@pytest.mark.parametrize("top_logprobs", [0, 2], ids=["sampled-in-the-graph", "a-row-asks-top-logprobs"])
async def test_rows_cached_to_their_last_token_decode_it_without_a_prefill_pass(tiny, top_logprobs):
    # A GRPO-like admission: two prompts of four copies each (seeded, sampled; one copy asks n=2) and one
    # prompt alone. With decode graphs (run eagerly on the CPU by EagerReplay) the warm pass stores both
    # groups' prompts but their last token, so their copies skip the prefill forward and decode that token
    # with the others: only the lone prompt runs one. Every choice is the one the plain path gives, whether
    # the graph samples the batch or (a row asking top_logprobs) the eager sampler does.
    groups = [SHARED + [20, 21], [700 + i for i in range(45)]]
    requests = [GenerationRequest(p, max_new_tokens=6, ignore_eos=True, n=2 if (g, i) == (1, 3) else 1,
                                  sampling=SamplingParams(temperature=1.0, seed=10 * g + i,
                                                          top_logprobs=top_logprobs if (g, i) == (0, 1) else 0))
                for g, p in enumerate(groups) for i in range(4)]
    requests.append(greedy([900 + i for i in range(30)], 6))
    outs, stats = [], []
    for graphs in (True, False):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
        eng = Engine(model, tok, max_batch_size=16, cuda_graphs=graphs)
        try:
            with eng.paused():  # one admission
                futures = [eng.submit(r) for r in requests]
            outs.append([f.result(timeout=120) for f in futures])
            stats.append(eng.stats)
        finally:
            eng.close()
    (graphed, plain), (g_stats, p_stats) = outs, stats
    assert (g_stats.warm_passes, g_stats.prefill_passes) == (1, 1) == (p_stats.warm_passes, p_stats.prefill_passes)
    # the warm pass's 51 + 44 tokens and the lone prompt's 30; the plain path also runs each copy's last token
    assert g_stats.prefill_tokens == p_stats.prefill_tokens - 8 == 51 + 44 + 30
    for a, b in zip(graphed, plain):
        assert len(a.completions) == len(b.completions)
        for ca, cb in zip(a.completions, b.completions):
            assert ca.token_ids == cb.token_ids and len(ca.token_ids) == 6
            assert max(abs(x - y) for x, y in zip(ca.logprobs, cb.logprobs)) < 1e-4
    asked = graphed[1].completions[0]
    assert len(asked.top_logprobs) == (6 if top_logprobs else 0)


async def test_a_prompt_cached_to_its_last_token_by_an_earlier_request_runs_no_prefill_pass(tiny):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=4, cuda_graphs=True)
    try:
        p = SHARED + [5, 6]
        with busy(eng):
            first = await eng.generate(greedy(p, 4))
            passes = eng.stats.prefill_passes
            again = await eng.generate(greedy(p, 4))  # hits 51 of 52: its last token is decoded
            assert eng.stats.prefill_passes == passes and eng.stats.prefix_hit_tokens == 51
        assert close(first, again)
    finally:
        eng.close()


async def test_adapters_do_not_share_entries_and_changes_clear_the_cache(tiny, adapter_dirs):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    eng = Engine(model, tok, max_batch_size=4)
    try:
        eng.add_adapter("a1", adapter_dirs[1])
        p = SHARED + [5, 6]
        with busy(eng):
            await eng.generate(greedy(p, 2))
            await eng.generate(greedy(p, 2, adapter="a1"))
            assert eng.stats.prefix_hit_tokens == 0  # the base's KV is not the adapter's
            await eng.generate(greedy(p, 2, adapter="a1"))
            assert eng.stats.prefix_hit_tokens == 51
            assert len(eng.prefix_cache) > 0
            with eng.paused():  # the trainer may change an adapter in place: forget everything
                assert len(eng.prefix_cache) > 0
            assert len(eng.prefix_cache) == 0
            await eng.generate(greedy(p, 2))
            assert len(eng.prefix_cache) > 0
            eng.add_adapter("a2", adapter_dirs[2])
            assert len(eng.prefix_cache) == 0
    finally:
        eng.close()


async def test_n_choices_and_seeds_with_the_cache(tiny):
    # n > 1 copies the prompt KV (cache hit included) to every choice; seeded samples match the cold run.
    req = lambda: GenerationRequest(SHARED + [3, 4], max_new_tokens=6, ignore_eos=True, n=3,
                                    sampling=SamplingParams(seed=7))
    (warm, cold), _ = await run_both(tiny, [req(), req()])
    for x, y in zip(warm, cold):
        assert [c.token_ids for c in x.completions] == [c.token_ids for c in y.completions]


def _cache(tokens=64, block=4, layers=2):
    buffers = SlotBuffers(layers, 4, 2, 8, 64, torch.float32, torch.device("cpu"))
    for i, t in enumerate(buffers.keys + buffers.values):
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(i)))
    return buffers, PrefixCache(buffers, tokens, block)


def test_pool_copies_columns_exactly_and_widens_partial_blocks():
    buffers, cache = _cache()
    toks = list(range(10))  # blocks [0-3] [4-7] and a partial [8, 9]
    assert cache.insert([("m", toks, 0)]) == 3
    hit = cache.match("m", toks + [50], limit=11)
    assert hit.length == 10 and [n for _, n in hit.segments] == [4, 4, 2]
    cache.copy_into([(2, hit)])
    for t in buffers.keys + buffers.values:
        assert torch.equal(t[2, :, :10], t[0, :, :10])
    # a longer prompt widens the partial block in place (same pool row), then shares 11 tokens
    assert cache.insert([("m", toks + [10, 11], 1)]) == 1 and len(cache) == 3
    assert cache.match("m", toks + [10, 99], limit=12).length == 11
    assert cache.match("m", [0, 1, 2, 99], limit=4).length == 3  # token granularity inside a block
    assert cache.match("other", toks, limit=10).length == 0


def test_eviction_drops_least_recent_leaves_and_their_subtrees():
    buffers, cache = _cache(tokens=16, block=4)  # 4 blocks
    a, b = [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9, 8, 8, 8, 8]
    cache.insert([("m", a, 0)])
    cache.insert([("m", b, 1)])
    assert len(cache) == 4
    cache.match("m", a, 8)  # touches a's leaf, then its root: LRU order b-leaf, b-root, a-leaf, a-root
    cache.insert([("m", [5, 5, 5, 5], 2)])  # one block: b's leaf goes, not its root
    assert cache.match("m", b, 8).length == 4  # order now a-leaf, a-root, [5], b-root
    cache.insert([("m", [6] * 8, 3)])  # two blocks: a's leaf, then a's root
    assert [cache.match("m", x, 8).length for x in (a, b, [5] * 4, [6] * 8)] == [0, 4, 4, 8]
    cache.insert([("m", [7] * 12, 0)])  # three blocks: b-root, [5], [6]'s leaf (its root was touched last)
    assert [cache.match("m", x, 12).length for x in (b, [5] * 4, [6] * 8, [7] * 12)] == [0, 0, 4, 12]
    assert len(cache) == 4


def test_plan_warm_picks_one_row_for_a_shared_system_prompt():
    # rows 0-3 share 50 tokens; rows 1 and 2 also share 2 more (not worth a row: 2 < MIN_WARM_GAIN).
    prompts = [SHARED + [1, 2], SHARED + [3, 4, 5], SHARED + [3, 4, 6], SHARED + [7]]
    plan = plan_warm(prompts, ["m"] * 4, [0, 0, 0, 0])
    assert len(plan) == 1 and plan[0][1] == 52  # a row of the pair, up to its 52 shared tokens
    assert plan_warm(prompts, ["m"] * 4, [50, 50, 50, 50]) == []  # the cache has it already
    assert plan_warm(prompts, ["m", "a", "b", "c"], [0] * 4) == []  # other adapters: nothing shared
    assert MIN_WARM_GAIN > 2


@pytest.mark.parametrize("V", [3, 300, 49152])
def test_inverse_cdf_matches_the_full_cumsum_and_skips_zero_probabilities(V):
    g = torch.Generator().manual_seed(V)
    probs = torch.softmax(torch.randn(64, V, generator=g) * 3, -1)
    probs[:, 1::2] = 0.0  # masked tokens
    u = torch.rand(64, dtype=torch.float64, generator=g)
    cdf = probs.double().cumsum(-1)
    full = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None])[:, 0].clamp(max=V - 1)
    two_level = inverse_cdf(probs, u)
    assert torch.equal(two_level, full)
    assert (probs.gather(1, two_level[:, None]) > 0).all()


def test_sampling_without_the_full_log_softmax_gives_the_same_tokens_and_logprobs():
    from groupwise.inference.sampling import sample_next

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(16, 49152, generator=g) * 4
    params = [SamplingParams(seed=s) for s in range(16)]
    fast = sample_next(logits, params, list(range(16)), [5] * 16, want_raw_BV=False)
    full = sample_next(logits, params, list(range(16)), [5] * 16, want_raw_BV=True)
    assert fast[2] is None and torch.equal(fast[0], full[0])
    ref = torch.log_softmax(logits, -1).gather(1, fast[0][:, None])[:, 0]
    assert (fast[1] - ref).abs().max() < 1e-5 and (full[1] - ref).abs().max() < 1e-6
