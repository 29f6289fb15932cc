"""Sampling: temperature, top-p, per-request seeds, and the logprobs we report.

Which logprob is reported (this matters for RL): the model's RAW log-softmax at temperature 1,
evaluated at the sampled token, before temperature, top-p or a grammar mask touch the logits.
That is vLLM's default (``logprobs_mode="raw_logprobs"``) and what the trainer recomputes with a
plain forward pass, so the importance ratio pi_new / pi_old starts at exactly 1 on-policy. The
distribution actually sampled from (tempered, truncated, masked) is a sampling device, not the
policy being trained.

Sampling is by inverse CDF: one uniform u per row, token = first index where cumsum(p) >= u.
The CDF is walked in two levels (`inverse_cdf`): masses of blocks of 256 tokens, then the cumsum
inside the one block u falls in; a full fp64 cumsum over V (49k-150k) terms cost more than the rest
of sampling together (~6 ms of a ~200 ms CPU decode step at 32 rows). Same distribution; the token
differs from the long cumsum's only when u lands within fp32 rounding of a boundary.
A seeded sequence's u is a hash of (seed, token index) (`seeded_uniform`), so its sample does not
depend on which other requests share the batch, and all rows are drawn in a few vectorised ops
(no per-row generator call, which would be a kernel launch each on CUDA, and no [B, V] noise).
Unseeded rows take u from the engine's generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingParams", "inverse_cdf", "sample_fixed", "sample_next", "seeded_uniform", "top_p_filter"]


@dataclass
class SamplingParams:
    """How one sequence samples. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0  # how many alternatives to report per position (0-20)

    def problems(self) -> list[str]:
        p: list[str] = []
        if not (self.temperature >= 0.0):
            p.append(f"temperature={self.temperature!r} must be >= 0")
        if not (0.0 < self.top_p <= 1.0):
            p.append(f"top_p={self.top_p!r} must be in (0, 1]")
        if not (0 <= self.top_logprobs <= 20):
            p.append(f"top_logprobs={self.top_logprobs!r} must be in [0, 20]")
        return p


def top_p_filter(logits_BV: torch.Tensor, top_p_B: torch.Tensor) -> torch.Tensor:
    """Set to -inf every token outside the smallest set whose probability reaches top_p (per row)."""
    sorted_logits, order = torch.sort(logits_BV, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Mass strictly before each token; a token is kept while that mass is < top_p (the first always is).
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p_B[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits_BV.masked_fill(drop, float("-inf"))


_M32 = 0xFFFFFFFF


def _pcg_hash(x: torch.Tensor) -> torch.Tensor:
    """PCG-RXS-M-XS 32-bit hash on int64 tensors holding values < 2**32 (products stay < 2**62)."""
    state = (x * 747796405 + 2891336453) & _M32
    word = (((state >> ((state >> 28) + 4)) ^ state) * 277803737) & _M32
    return ((word >> 22) ^ word) & _M32


def seeded_uniform(seeds_B: torch.Tensor, steps_B: torch.Tensor) -> torch.Tensor:
    """[B] uniforms in (0, 1), a pure function of (seed, step)."""
    hi = _pcg_hash(_pcg_hash(seeds_B & _M32) ^ _pcg_hash((steps_B + 0x9E3779B9) & _M32))
    lo = _pcg_hash(hi ^ 0x85EBCA6B)
    bits = ((hi >> 8) << 24) | (lo >> 8)  # 48 random bits: exact in float64, resolves p ~ 1e-14
    return (bits.double() + 0.5) / float(1 << 48)


def sample_next(
    logits_BV: torch.Tensor,  # [B, V] raw model logits (any dtype)
    params: list[SamplingParams],
    seeds: list[int | None],  # per row: the sequence's seed (request seed + choice index) or None
    steps: list[int],  # per row: index of the token being sampled (0 for the first)
    allowed_mask_BV: torch.Tensor | None = None,  # [B, V] bool, True = allowed (grammar), or None
    default_generator: torch.Generator | None = None,
    want_raw_BV: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Sample one token per row. Returns (token_ids_B, raw_logprobs_B, raw_logprobs_BV or None).

    raw_logprobs is log_softmax(logits) in fp32, untouched by temperature/top-p/mask (module doc).
    Without `want_raw_BV` (no top_logprobs asked) and when every row samples the model's own
    distribution, the [B, V] log-softmax is never built: probs = softmax(logits), and
    log_softmax at the token = logit - lse with lse = max logit - log(max prob) (max prob >= 1/V,
    so its log is exact to fp32 rounding), which saves two passes over [B, V] a step.
    """
    logits = logits_BV.float()
    B = logits.shape[0]
    plain = allowed_mask_BV is None and all(p.temperature == 1.0 and p.top_p >= 1.0 for p in params)
    if plain and not want_raw_BV:
        probs_BV = torch.softmax(logits, dim=-1)
        u = _uniforms(list(range(B)), seeds, steps, logits.device, default_generator)
        tokens_B = inverse_cdf(probs_BV, u)
        lse_B = logits.amax(-1) - probs_BV.amax(-1).log()
        return tokens_B, logits.gather(1, tokens_B[:, None])[:, 0] - lse_B, None
    raw_logprobs_BV = torch.log_softmax(logits, dim=-1)  # [B, V]
    work = logits
    if allowed_mask_BV is not None:
        work = work.masked_fill(~allowed_mask_BV, float("-inf"))
    # Row decisions are made on Python values: no device sync before the one in the caller's .tolist().
    dev = logits.device
    greedy_rows = [i for i in range(B) if params[i].temperature == 0.0]
    sampled_rows = [i for i in range(B) if params[i].temperature > 0.0]
    if len(greedy_rows) == B:
        tokens_B = torch.argmax(work, dim=-1)
    else:
        tokens_B = torch.empty(B, dtype=torch.long, device=dev)
        if greedy_rows:
            g = torch.tensor(greedy_rows, device=dev)
            tokens_B[g] = torch.argmax(work[g], dim=-1)
    if sampled_rows:
        whole = len(sampled_rows) == B
        idx = None if whole else torch.tensor(sampled_rows, device=dev)
        plain = allowed_mask_BV is None and all(params[i].temperature == 1.0 and params[i].top_p >= 1.0
                                                  for i in sampled_rows)
        if plain:  # the model's own distribution, computed as in the fast path above (same tokens)
            probs = torch.softmax(logits if whole else logits[idx], dim=-1)  # [b, V]
        else:
            temps = torch.tensor([params[i].temperature for i in sampled_rows], dtype=torch.float32, device=dev)
            scaled = (work if whole else work[idx]) / temps[:, None]
            if any(params[i].top_p < 1.0 for i in sampled_rows):
                top_p = torch.tensor([params[i].top_p for i in sampled_rows], device=dev)
                scaled = top_p_filter(scaled, top_p)
            probs = torch.softmax(scaled, dim=-1)  # [b, V]
        u = _uniforms(sampled_rows, seeds, steps, dev, default_generator)
        choice = inverse_cdf(probs, u)
        if whole:
            tokens_B = choice
        else:
            tokens_B[idx] = choice
    logprobs_B = raw_logprobs_BV.gather(1, tokens_B[:, None])[:, 0]
    return tokens_B, logprobs_B, raw_logprobs_BV


def sample_fixed(logits_BV: torch.Tensor, temps_B: torch.Tensor, seeds_B: torch.Tensor,
                 steps_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_next` for rows without top-p, grammar mask or top_logprobs, in fixed-shape tensor ops
    only (no Python decision on values), so a CUDA graph can capture it with the decode step.

    temps_B: per-row temperature (0 = greedy); seeds_B, steps_B: the (seed, token index) whose hash
    is the row's uniform (`seeded_uniform`; the engine gives an unseeded row a fresh random seed per
    step). Same tokens as `sample_next` for the same uniforms; the logprob is the raw log-softmax at
    the token (module doc), computed as log_softmax (sample_next's shortcut differs in the last bits).
    Returns (token_ids_B, raw_logprobs_B).
    """
    logits = logits_BV.float()
    greedy_B = temps_B == 0
    probs_BV = torch.softmax(logits / torch.where(greedy_B, 1.0, temps_B)[:, None], dim=-1)
    sampled_B = inverse_cdf(probs_BV, seeded_uniform(seeds_B, steps_B))
    tokens_B = torch.where(greedy_B, logits.argmax(-1), sampled_B)
    logprobs_B = torch.log_softmax(logits, dim=-1).gather(1, tokens_B[:, None])[:, 0]
    return tokens_B, logprobs_B


def _uniforms(rows: list[int], seeds: list[int | None], steps: list[int], dev: torch.device,
              default_generator: torch.Generator | None) -> torch.Tensor:
    """[len(rows)] fp64 uniforms: seeded rows hash (seed, step), the others draw from the generator."""
    u = torch.empty(len(rows), dtype=torch.float64, device=dev)
    seeded = [j for j, i in enumerate(rows) if seeds[i] is not None]
    unseeded = [j for j, i in enumerate(rows) if seeds[i] is None]
    if seeded:
        rs = [rows[j] for j in seeded]
        u_seeded = seeded_uniform(torch.tensor([seeds[i] for i in rs], device=dev),
                                  torch.tensor([steps[i] for i in rs], device=dev))
        if len(seeded) == len(rows):
            return u_seeded
        u[torch.tensor(seeded, device=dev)] = u_seeded
    if unseeded:
        u[torch.tensor(unseeded, device=dev)] = torch.rand(
            len(unseeded), dtype=torch.float64, device=dev, generator=default_generator)
    return u


def inverse_cdf(probs_BV: torch.Tensor, u_B: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Per row, a token drawn from probs by one uniform u: [B] token ids.

    Two levels (module doc): the block where the CDF of block masses reaches u x total, then the
    token where the CDF inside that block reaches the same fraction of the block's mass. That is
    exactly inverse-CDF sampling (P(block) = mass / total, then P(token | block) = p / mass); only
    the rounding differs from one long cumsum (block masses are fp32 sums of 256 terms: relative
    1e-7, the size of fp32's own error on p; converting all of probs to fp64 first cost 5 ms a step).
    Zero-probability tokens sit on flat steps of both CDFs and are never chosen.
    """
    B, V = probs_BV.shape
    nb = -(-V // block)
    if nb * block != V:
        probs_BV = torch.nn.functional.pad(probs_BV, (0, nb * block - V))
    blocks = probs_BV.view(B, nb, block)
    mass = blocks.sum(-1)  # [B, nb]
    cdf_blocks = mass.double().cumsum(-1)
    target = u_B[:, None] * cdf_blocks[:, -1:]  # [B, 1]; u in (0, 1), so 0 < target < total
    j = torch.searchsorted(cdf_blocks, target).clamp_(max=nb - 1)  # [B, 1]: cdf[j-1] < target <= cdf[j]
    before = torch.where(j > 0, cdf_blocks.gather(1, (j - 1).clamp(min=0)), torch.zeros_like(target))
    frac = ((target - before) / mass.gather(1, j).double()).clamp_(max=1.0)  # (0, 1]: where inside the block
    inside = blocks.gather(1, j[:, :, None].expand(B, 1, block))[:, 0]  # [B, block]
    cdf_inside = inside.double().cumsum(-1)
    i = torch.searchsorted(cdf_inside, frac * cdf_inside[:, -1:])  # [B, 1]
    ar = torch.arange(block, device=probs_BV.device)
    i = torch.minimum(i, torch.where(inside > 0, ar, -1).amax(-1, keepdim=True))  # rounding past the end
    return (j * block + i)[:, 0]
