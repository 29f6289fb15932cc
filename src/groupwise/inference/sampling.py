"""Sampling: temperature, top-k/top-p/min-p, repetition/presence/frequency penalties, per-request
seeds, and the logprobs we report.

Which logprob is reported (this matters for RL): the model's RAW log-softmax at temperature 1,
evaluated at the sampled token, before temperature, top-p or a grammar mask touch the logits.
That is vLLM's default (``logprobs_mode="raw_logprobs"``) and what the trainer recomputes with a
plain forward pass, so the importance ratio pi_new / pi_old starts at exactly 1 on-policy. The
distribution actually sampled from (tempered, truncated, masked) is a sampling device, not the
policy being trained.

Sampling is by inverse CDF: one uniform u per row, token = first index where cumsum(p) >= u.
The CDF is walked in two levels (`inverse_cdf`): masses of blocks of 256 tokens, then the cumsum
inside the one block u falls in; a full fp64 cumsum over V (49k-150k) terms would cost more than the
rest of sampling together. Same distribution; the token
differs from the long cumsum's only when u lands within fp32 rounding of a boundary.
A seeded sequence's u is a hash of (seed, token index) (`seeded_uniform`), so its sample does not
depend on which other requests share the batch, and all rows are drawn in a few vectorised ops
(no per-row generator call, which would be a kernel launch each on CUDA, and no [B, V] noise).
Unseeded rows take u from the engine's generator.

The extras follow vLLM's OpenAI server (what ART users pass through ``extra_body``), in vLLM's
order: penalties change the logits (repetition_penalty over the prompt and the output so far,
presence/frequency over the output), then temperature, then min_p, top_k and top_p keep a prefix
of the tokens sorted by probability (`truncate`; top_p counts the mass of what min_p and top_k
kept). `truncate` uses fixed-shape tensor ops only, so the CUDA graph (`sample_fixed`) runs the
very same function as the eager path; penalties need each row's token history and stay eager.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from groupwise.errors import ConfigError

__all__ = ["SEED_MAX", "SEED_MIN", "TOP_K_MAX", "SamplingParams", "apply_penalties", "inverse_cdf", "sample_fixed", "sample_next",
           "seeded_uniform", "top_p_filter", "truncate"]

# A seed is an int64, as in OpenAI's API; choice i of a request uses seed + i, which must fit too.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
# top_k goes into an int64 tensor with the batch's other rows; any k from the vocabulary's size up keeps
# every token, so the bound refuses nothing a caller could mean.
TOP_K_MAX = 2**63 - 1


GREEDY_BELOW_TEMPERATURE = 1e-5  # a positive temperature below this samples greedily (SamplingParams)
REPETITION_PENALTY_RANGE = (0.01, 100.0)


@dataclass
class SamplingParams:
    """How one sequence samples. temperature 0 means greedy; top_k 0 (or -1) and min_p 0 are off."""

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_logprobs: int = 0  # how many alternatives to report per position (0-20)
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # > 1 discourages tokens of the prompt and the output so far
    presence_penalty: float = 0.0  # subtracted once from each token already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output

    def __post_init__(self) -> None:
        # A temperature this small samples the argmax anyway; far smaller ones leave float32 (logits / t is
        # inf, or t is 0) and the softmax NaN, which sampled one fixed junk token with a 200.
        if isinstance(self.temperature, (int, float)) and 0.0 < self.temperature < GREEDY_BELOW_TEMPERATURE:
            self.temperature = 0.0

    @property
    def truncates(self) -> bool:
        """Does `truncate` change this row (top_k, top_p or min_p set)?"""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def penalized(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def problems(self, n: int = 1) -> list[str]:
        p: list[str] = []
        if not (0.0 <= self.temperature < float("inf")):
            p.append(f"temperature={self.temperature!r} must be >= 0")
        if not (0.0 < self.top_p <= 1.0):
            p.append(f"top_p={self.top_p!r} must be in (0, 1]")
        if not (0 <= self.top_logprobs <= 20):
            p.append(f"top_logprobs={self.top_logprobs!r} must be in [0, 20]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not -1 <= self.top_k <= TOP_K_MAX:
            p.append(f"top_k={self.top_k!r} must be an integer in [1, 2**63 - 1] (0 or -1 turn it off; "
                     "one at least the vocabulary's size keeps every token)")
        if not (0.0 <= self.min_p <= 1.0):
            p.append(f"min_p={self.min_p!r} must be in [0, 1]")
        if not (REPETITION_PENALTY_RANGE[0] <= self.repetition_penalty <= REPETITION_PENALTY_RANGE[1]):
            # logits divided by a penalty near 0 leave float32 (inf, then NaN): bounded as a multiplier is
            p.append(f"repetition_penalty={self.repetition_penalty!r} must be in [{REPETITION_PENALTY_RANGE[0]}, "
                     f"{REPETITION_PENALTY_RANGE[1]}] (1 turns it off)")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (-2.0 <= getattr(self, name) <= 2.0):
                p.append(f"{name}={getattr(self, name)!r} must be in [-2, 2]")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not SEED_MIN <= self.seed <= SEED_MAX - (n - 1)):
            p.append(f"seed={self.seed!r} must be an integer in [-2**63, 2**63 - 1] (seed + n - 1 too: choice i "
                     "uses seed + i)")
        return p


def top_p_filter(logits_BV: torch.Tensor, top_p_B: torch.Tensor) -> torch.Tensor:
    """Set to -inf every token outside the smallest set whose probability reaches top_p (per row)."""
    zeros = torch.zeros(logits_BV.shape[0], device=logits_BV.device)
    return truncate(logits_BV, zeros.long(), top_p_B, zeros)


def truncate(logits_BV: torch.Tensor, top_k_B: torch.Tensor, top_p_B: torch.Tensor,
             min_p_B: torch.Tensor) -> torch.Tensor:
    """Set to -inf every token that min_p, top_k or top_p drops (per row; 0, 0 and 1 leave a row as is).

    In the order of the probabilities (softmax of `logits_BV`, already divided by the temperature):
    min_p keeps tokens with p >= min_p * max p, top_k the k most likely; both keep a prefix of the
    sorted tokens. top_p then keeps, within that prefix, the tokens whose mass before them is below
    top_p of the prefix's mass (the first always stays). Fixed-shape ops only (module doc).
    """
    V = logits_BV.shape[-1]
    sorted_BV, order_BV = torch.sort(logits_BV, dim=-1, descending=True)
    probs_BV = torch.softmax(sorted_BV, dim=-1)
    rank_V = torch.arange(V, device=logits_BV.device)
    k_B = torch.where(top_k_B > 0, top_k_B, V)
    keep_BV = (rank_V[None, :] < k_B[:, None]) & (probs_BV >= min_p_B[:, None] * probs_BV[:, :1])
    kept_BV = probs_BV * keep_BV
    mass_before_BV = torch.cumsum(kept_BV, dim=-1) - kept_BV
    within_p_BV = mass_before_BV < top_p_B[:, None] * kept_BV.sum(-1, keepdim=True)
    keep_BV &= within_p_BV | (top_p_B[:, None] >= 1.0)  # top_p 1 keeps all (no rounding at the tail)
    keep_BV[:, 0] = True
    drop_BV = torch.zeros_like(keep_BV).scatter(-1, order_BV, ~keep_BV)
    return logits_BV.masked_fill(drop_BV, float("-inf"))


def apply_penalties(logits_BV: torch.Tensor, params: list[SamplingParams], prompts: list[list[int]],
                    outputs: list[list[int]]) -> torch.Tensor:
    """The logits after each row's repetition, presence and frequency penalties (vLLM's definitions).

    repetition_penalty r (CTRL's): a token seen in the prompt or the output has its logit divided by
    r when positive, multiplied by r when negative. presence a and frequency f: a token seen c > 0
    times in the output loses a + f * c. Rows without penalties are returned unchanged.
    """
    B, V = logits_BV.shape
    dev = logits_BV.device
    rows = [i for i in range(B) if params[i].penalized]
    if not rows:
        return logits_BV
    idx = torch.tensor(rows, device=dev)
    work = logits_BV[idx].float()  # [b, V]

    def counts(seqs: list[list[int]]) -> torch.Tensor:
        width = max((len(s) for s in seqs), default=0)
        ids = torch.full((len(seqs), max(width, 1)), V, dtype=torch.long)  # V = padding, dropped below
        for j, s in enumerate(seqs):
            ids[j, : len(s)] = torch.tensor(s, dtype=torch.long)
        out = torch.zeros(len(seqs), V + 1, device=dev)
        return out.scatter_add_(1, ids.to(dev), torch.ones(ids.shape, device=dev))[:, :V]

    out_counts = counts([outputs[i] for i in rows])  # [b, V]
    rep = torch.tensor([params[i].repetition_penalty for i in rows], device=dev)[:, None]
    if bool((rep != 1.0).any()):
        seen = (counts([prompts[i] for i in rows]) + out_counts) > 0
        work = torch.where(seen, torch.where(work > 0, work / rep, work * rep), work)
    freq = torch.tensor([params[i].frequency_penalty for i in rows], device=dev)[:, None]
    pres = torch.tensor([params[i].presence_penalty for i in rows], device=dev)[:, None]
    work = work - freq * out_counts - pres * (out_counts > 0)
    out = logits_BV.float().clone()
    out[idx] = work
    return out


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
    history: tuple[list[list[int]], list[list[int]]] | None = None,  # per row (prompt ids, output ids): penalties
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Sample one token per row. Returns (token_ids_B, raw_logprobs_B, raw_logprobs_BV or None).

    raw_logprobs is log_softmax(logits) in fp32, untouched by penalties/temperature/truncation/mask
    (module doc). Without `want_raw_BV` (no top_logprobs asked) and when every row samples the
    model's own distribution, the [B, V] log-softmax is never built: probs = softmax(logits), and
    log_softmax at the token is the log of the token's probability. That probability is never 0
    (`inverse_cdf` never picks a zero-probability token) and fp32 keeps its relative precision down
    to 1e-38, so its log is exact to fp32 rounding: closer than logit - lse, whose lse carries the
    rounding of a logit of size ~10 (measured on 64 rows of 49,152 logits: 6.2e-6 from fp64's
    log-softmax, the fp32 log-softmax's own error, against 6.7e-6). And it reads one value a row
    where logit - lse needed two max reductions over [B, V].
    """
    logits = logits_BV.float()
    B = logits.shape[0]

    def own(p: SamplingParams) -> bool:  # samples the model's own distribution
        return p.temperature == 1.0 and not p.truncates and not p.penalized

    plain = allowed_mask_BV is None and all(own(p) for p in params)
    if plain and not want_raw_BV:
        probs_BV = torch.softmax(logits, dim=-1)
        u = _uniforms(list(range(B)), seeds, steps, logits.device, default_generator)
        tokens_B = inverse_cdf(probs_BV, u)
        return tokens_B, probs_BV.gather(1, tokens_B[:, None])[:, 0].log(), None
    raw_logprobs_BV = torch.log_softmax(logits, dim=-1)  # [B, V]
    work = logits
    if any(p.penalized for p in params):
        if history is None:
            raise ConfigError("penalties need each row's (prompt ids, output ids): pass history",
                              what="sample arguments")
        work = apply_penalties(work, params, *history)
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
        if allowed_mask_BV is None and all(own(params[i]) for i in sampled_rows):
            # the model's own distribution, computed as in the fast path above (same tokens)
            probs = torch.softmax(logits if whole else logits[idx], dim=-1)  # [b, V]
        else:
            rows = [params[i] for i in sampled_rows]
            temps = torch.tensor([p.temperature for p in rows], dtype=torch.float32, device=dev)
            scaled = (work if whole else work[idx]) / temps[:, None]
            if any(p.truncates for p in rows):
                scaled = truncate(scaled, *_truncation(rows, dev))
            probs = torch.softmax(scaled, dim=-1)  # [b, V]
        u = _uniforms(sampled_rows, seeds, steps, dev, default_generator)
        choice = inverse_cdf(probs, u)
        if whole:
            tokens_B = choice
        else:
            tokens_B[idx] = choice
    logprobs_B = raw_logprobs_BV.gather(1, tokens_B[:, None])[:, 0]
    return tokens_B, logprobs_B, raw_logprobs_BV


def _truncation(params: list[SamplingParams], dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (top_k, top_p, min_p) tensors for `truncate`."""
    return (torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.long, device=dev),
            torch.tensor([p.top_p for p in params], dtype=torch.float32, device=dev),
            torch.tensor([p.min_p for p in params], dtype=torch.float32, device=dev))


def sample_fixed(logits_BV: torch.Tensor, temps_B: torch.Tensor, seeds_B: torch.Tensor, steps_B: torch.Tensor,
                 filters: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_next` for rows without penalties, grammar mask or top_logprobs, in fixed-shape tensor
    ops only (no Python decision on values), so a CUDA graph can capture it with the decode step.

    temps_B: per-row temperature (0 = greedy); seeds_B, steps_B: the (seed, token index) whose hash
    is the row's uniform (`seeded_uniform`; the engine gives an unseeded row a fresh random seed per
    step); filters: per-row (top_k, top_p, min_p) for `truncate`, or None when no row truncates.
    Same tokens as `sample_next` for the same uniforms; the logprob is the raw log-softmax at the
    token (module doc), computed as log_softmax (sample_next's shortcut differs in the last bits).
    Returns (token_ids_B, raw_logprobs_B).
    """
    logits = logits_BV.float()
    greedy_B = temps_B == 0
    scaled_BV = logits / torch.where(greedy_B, 1.0, temps_B)[:, None]
    if filters is not None:
        scaled_BV = truncate(scaled_BV, *filters)
    probs_BV = torch.softmax(scaled_BV, dim=-1)
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
    1e-7, the size of fp32's own error on p; converting all of probs to fp64 first would cost more).
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
