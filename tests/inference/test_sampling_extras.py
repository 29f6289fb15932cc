"""The sampling extras (top_k, min_p, repetition/presence/frequency penalties) on CPU tensors, and
the graph path's sampling (sample_fixed, run here by decode_graphs.EagerReplay) agreeing with the
eager one (sample_next) on them."""

from __future__ import annotations

import asyncio
import math

import torch

from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams, apply_penalties, sample_fixed, sample_next, truncate
from groupwise.runtime.loading import tiny_random_model

PROBS = [0.4, 0.3, 0.15, 0.1, 0.05]


def _freq(params: SamplingParams, rows: int = 4000) -> torch.Tensor:
    """Empirical token frequencies over `rows` seeded draws from PROBS."""
    logits = torch.log(torch.tensor([PROBS])).repeat(rows, 1)
    ps = [SamplingParams(**{**params.__dict__, "seed": s}) for s in range(rows)]
    tokens, logprobs, _ = sample_next(logits, ps, list(range(rows)), [0] * rows)
    # the reported logprob is the model's own, whatever the filters did
    assert torch.allclose(logprobs, torch.log(torch.tensor(PROBS))[tokens])
    return torch.bincount(tokens, minlength=len(PROBS)).float() / rows


def _renormalised(keep: int) -> torch.Tensor:
    p = torch.tensor(PROBS[:keep] + [0.0] * (len(PROBS) - keep))
    return p / p.sum()


def test_top_k_keeps_the_k_most_likely_tokens():
    assert torch.allclose(_freq(SamplingParams(top_k=2)), _renormalised(2), atol=0.03)
    assert torch.allclose(_freq(SamplingParams(top_k=-1)), torch.tensor(PROBS), atol=0.03)  # -1: off


def test_min_p_keeps_tokens_above_a_fraction_of_the_top_one():
    # threshold 0.3 * 0.4 = 0.12: 0.4, 0.3 and 0.15 stay
    assert torch.allclose(_freq(SamplingParams(min_p=0.3)), _renormalised(3), atol=0.03)


def test_top_p_counts_the_mass_that_top_k_kept():
    # top_k=3 keeps 0.4/0.3/0.15 (renormalised 0.47/0.35/0.18); top_p=0.8 then keeps 0.47 + 0.35
    # (the mass before the third is 0.82 >= 0.8), so only the first two are drawn.
    assert torch.allclose(_freq(SamplingParams(top_k=3, top_p=0.8)), _renormalised(2), atol=0.03)


def test_truncate_leaves_rows_without_filters_exactly_as_they_are():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 1000, generator=g) * 4
    out = truncate(logits, torch.tensor([0, 5, 0]), torch.tensor([1.0, 1.0, 0.5]), torch.tensor([0.0, 0.0, 0.0]))
    assert torch.equal(out[0], logits[0])
    assert torch.isfinite(out[1]).sum() == 5 and torch.equal(out[1].topk(5).indices, logits[1].topk(5).indices)
    kept = torch.softmax(logits[2], -1)[torch.isfinite(out[2])]
    assert kept.sum() >= 0.5 and kept.sum() - kept.min() < 0.5  # the smallest set reaching 0.5


def test_penalties_follow_their_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, 0.0]])
    prompt, output = [1], [3, 3, 2]

    def pen(**kw):
        return apply_penalties(logits, [SamplingParams(**kw)], [prompt], [output])[0].tolist()

    # repetition 2: seen tokens (1 from the prompt, 2 and 3 from the output) shrink towards "unlikely"
    assert pen(repetition_penalty=2.0) == [2.0, -2.0, 0.25, 1.5, 0.0]
    # presence 0.5: once per token in the output; frequency 0.5: per occurrence
    assert pen(presence_penalty=0.5) == [2.0, -1.0, 0.0, 2.5, 0.0]
    assert pen(frequency_penalty=0.5) == [2.0, -1.0, 0.0, 2.0, 0.0]
    assert pen(frequency_penalty=-1.0) == [2.0, -1.0, 1.5, 5.0, 0.0]  # negative: encourages repeats
    assert pen() == logits[0].tolist()


def test_penalties_change_the_greedy_choice():
    logits = torch.tensor([[3.0, 2.9, 0.0]])
    history = ([[]], [[0]])  # token 0 already generated
    greedy = dict(temperature=0.0)
    for extra in ({}, {"presence_penalty": 0.2}, {"frequency_penalty": 0.2}, {"repetition_penalty": 1.1}):
        tok, lp, _ = sample_next(logits, [SamplingParams(**greedy, **extra)], [None], [1], history=history)
        assert tok.item() == (0 if not extra else 1), extra
        assert math.isclose(lp.item(), torch.log_softmax(logits, -1)[0, tok.item()].item(), rel_tol=1e-6)


def test_graph_sampling_draws_the_same_tokens_with_filters():
    # sample_fixed (what the CUDA graph runs) and sample_next, same uniforms: same tokens, row by row,
    # with every mix of temperature, top_k, top_p and min_p in one batch.
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(6, 700, generator=g) * 3
    params = [SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=0.7, top_k=5, seed=2),
              SamplingParams(temperature=1.3, top_p=0.6, seed=3), SamplingParams(min_p=0.2, seed=4),
              SamplingParams(temperature=0.0, top_k=3, seed=5),
              SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.01, seed=6)]
    steps = [0, 3, 5, 8, 1, 2]
    tok_a, lp_a, _ = sample_next(logits, params, [p.seed for p in params], steps)
    filters = (torch.tensor([max(p.top_k, 0) for p in params]), torch.tensor([p.top_p for p in params]),
               torch.tensor([p.min_p for p in params]))
    tok_b, lp_b = sample_fixed(logits, torch.tensor([p.temperature for p in params]),
                               torch.tensor([p.seed for p in params]), torch.tensor(steps), filters)
    assert torch.equal(tok_a, tok_b)
    torch.testing.assert_close(lp_a, lp_b, atol=1e-5, rtol=0)
    # and each row alone draws what it drew in the batch
    for i, p in enumerate(params):
        alone, _, _ = sample_next(logits[i : i + 1], [p], [p.seed], [steps[i]])
        assert alone.item() == tok_a[i].item()


async def test_engine_graph_path_samples_extras_like_eager(tiny):
    # cuda_graphs=True off CUDA replays the graph's step eagerly (decode_graphs.EagerReplay) with
    # in-graph sampling; rows with top_k/top_p/min_p and a penalised row must decode as eagerly.
    params = [SamplingParams(seed=1, top_k=8), SamplingParams(seed=2, min_p=0.05, temperature=0.8),
              SamplingParams(seed=3, top_p=0.7, top_k=50), SamplingParams(seed=4, frequency_penalty=1.5)]
    outs = []
    for graphs in (False, True):
        model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
        eng = Engine(model, tok, max_batch_size=4, cuda_graphs=graphs)
        try:
            prompt = tok("Hello there")["input_ids"]
            # the penalised row ends first: the batch samples eagerly while it runs, in the graph after
            rs = await asyncio.gather(*[eng.generate(GenerationRequest(prompt, max_new_tokens=4 if p.penalized else 10,
                                                                       ignore_eos=True, sampling=p)) for p in params])
            outs.append([r.completions[0].token_ids for r in rs])
            if graphs:
                assert any(key[3] and key[4] for key in eng.runner.graphs)  # a sampling graph with filters ran
        finally:
            eng.close()
    assert outs[0] == outs[1]
    assert all(len(set(ids)) > 1 for ids in outs[0])


def test_sampling_params_problems_name_each_field():
    bad = SamplingParams(top_k=-2, min_p=1.5, repetition_penalty=0.0, presence_penalty=3.0, frequency_penalty=-2.5,
                         seed=2**70, temperature=float("nan"))
    text = " ".join(bad.problems())
    for field in ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "temperature"):
        assert field in text, field
    assert SamplingParams(seed=2**63 - 1).problems(n=1) == []
    assert SamplingParams(seed=2**63 - 1).problems(n=2)  # seed + 1 would overflow int64
    # top_k goes into an int64 tensor: past int64 is refused; anything up to it (past the vocabulary: keep all) is fine
    assert SamplingParams(top_k=2**63).problems() and SamplingParams(top_k=2**63 - 1).problems() == []


async def test_a_top_k_past_the_vocabulary_keeps_every_token(tiny):
    """A top_k of the vocabulary's size or more truncates nothing: seeded, it samples what no top_k does."""
    model, tok = tiny
    ids = tok("hello there", add_special_tokens=False)["input_ids"]
    with Engine(model, tok, max_batch_size=4) as engine:
        outs = [await engine.generate(GenerationRequest(ids, max_new_tokens=6, ignore_eos=True,
                                                        sampling=SamplingParams(seed=3, top_k=k)))
                for k in (0, 2**63 - 1, len(tok) + 7)]
    assert [o.completions[0].token_ids for o in outs[1:]] == [outs[0].completions[0].token_ids] * 2


def test_the_plain_path_reports_the_raw_log_softmax_at_each_sampled_token():
    # No top_logprobs asked, every row at temperature 1: the logprob is the log of the sampled token's
    # probability (no [B, V] log-softmax, no max reductions), and it must be the raw log-softmax there.
    g = torch.Generator().manual_seed(5)
    rows, vocab = 64, 49152
    logits = torch.randn(rows, vocab, generator=g) * 4
    logits[0, 7] = 40.0  # a row all but certain of one token
    logits[1] *= 0.01  # a row near uniform: every token has probability ~1/V
    params = [SamplingParams(seed=i) for i in range(rows)]
    tokens, logprobs, raw = sample_next(logits, params, list(range(rows)), [0] * rows, want_raw_BV=False)
    assert raw is None and tokens[0] == 7
    at = (torch.arange(rows), tokens)
    # the fp32 log-softmax's own value, and fp64's within fp32's error on a sum of 49k terms (~sqrt(49k) ulps:
    # 6e-6 to 1.3e-5 measured, by the CPU's vector width, which sets the summation order)
    torch.testing.assert_close(logprobs, torch.log_softmax(logits, -1)[at], atol=1e-6, rtol=0)
    torch.testing.assert_close(logprobs.double(), torch.log_softmax(logits.double(), -1)[at], atol=3e-5, rtol=0)
    with_raw, _, raw = sample_next(logits, params, list(range(rows)), [0] * rows, want_raw_BV=True)
    assert torch.equal(tokens, with_raw) and raw is not None
