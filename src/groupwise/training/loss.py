"""The GRPO policy-gradient loss: one pure function that reads like the equation.

For every trainable token t of sequence b (mask_BT = 1), with A_b the group-relative advantage of b's
trajectory (training/advantages.py), pi the current policy (LoRA on), pi_old the policy that sampled the
token (its logprob came back from the inference server), and pi_ref the reference policy (the base model,
LoRA off, or a checkpoint of the run: TrainConfig.kl_reference_step):

    rho_bt  = exp(log pi(y_bt) - log pi_old(y_bt))                         importance ratio
    PPO:    l_bt = -min(rho_bt * A_b, clip(rho_bt, 1 - eps, 1 + eps_high) * A_b)
    CISPO:  l_bt = -sg[clip(rho_bt, 1 - eps, 1 + eps_high)] * A_b * log pi(y_bt)
    KL:     l_bt += beta * (exp(q_bt) - q_bt - 1),   q_bt = log pi_ref(y_bt) - log pi(y_bt)   (k3)

On-policy distillation (TrainConfig.teacher). A teacher pi_T scores every token the student sampled, and
the per-token reverse KL, KL(pi || pi_T), estimated on the student's own samples, becomes a per-token
advantage (Tinker's cookbook, prime-rl's OPD), added to the group's through the same clipped ratio:

    D_bt    = -sg[log pi(y_bt) - log pi_T(y_bt)]                           distillation advantage
    A_bt    = A_b + lambda * D_bt                                           lambda = TrainConfig.distill_coef

The policy gradient of -E_pi[D] is the gradient of KL(pi || pi_T) (the score-function estimate of it
with y ~ pi), so the student moves toward the teacher only where it samples, as reverse KL does
(mode-seeking). The step reports mean_bt (log pi - log pi_T) as `teacher_kl`.

That is TrainConfig.distill_estimate="sampled". With "topk" the KL at each trained position is taken over
a support instead of one sample: S_bt, the union of the student's and the teacher's k likeliest tokens
there (k = TrainConfig.distill_top_k), both distributions renormalised on S_bt,

    p~(v)   = pi(v) / sum_{u in S} pi(u),   q~(v) = pi_T(v) / sum_{u in S} pi_T(u)        v in S_bt
    K_bt    = sum_{v in S_bt} p~(v) (log p~(v) - log q~(v))                   top-k reverse KL
    l_bt   += lambda * K_bt

an exact KL on S_bt with its full gradient through the student's log-probs there (no sampling noise, and a
signal on the tokens the student did not sample), added to the loss as the KL term is, not to the
advantage. The union holds both modes: the teacher's top-k alone would never show the student its own
likely tokens that the teacher rejects. Renormalising drops the mass outside S_bt (the tail), as the
top-k distillation losses of the literature do; with k >= the vocabulary it is the exact reverse KL.
The step reports mean_bt K_bt as `teacher_kl`.

Off-policy correction (TrainConfig.off_policy). The rollouts of an asynchronous run were sampled by a
behaviour policy mu (an older adapter, or one that changed mid-sequence: partial rollouts) while the
trainer holds pi. The ratio is then decoupled (AReaL): the PPO/CISPO ratio is taken against the
trainer's own policy at the start of the step, pi_prox = sg[pi] (rho_bt = 1 in value, the gradient of
log pi kept: one optimiser step per batch), and the gap to the behaviour policy is an importance weight

    w_bt    = exp(sg[log pi(y_bt)] - log mu(y_bt))                         behaviour importance weight
    TIS:    w~_bt = min(w_bt, C)                                            truncated (the weight is capped)
    MIS:    w~_bt = w_bt * 1[w_bt <= C]                                     masked (the token is dropped)
    l_bt   <- w~_bt * l_bt(rho_bt = pi / pi_prox)

with C = TrainConfig.importance_cap. Without correction ("none", the default) the sampler's logprob is
pi_old itself, as below: right for a synchronous run, where the sampler and the trainer hold the same
adapter and the ratio only measures their numerical mismatch.

and the step loss is a weighted sum of l_bt over the trainable tokens of the WHOLE step:

    normalize="token"     L = sum_bt l_bt / N_tokens                         (DAPO)
    normalize="sequence"  L = (1 / N_seqs) sum_b (1 / n_b) sum_t l_bt         (GRPO)
    normalize="constant"  L = sum_bt l_bt / (N_seqs * max_len)               (Dr. GRPO)

N_tokens and N_seqs count the whole step, not the micro-batch, and are arguments: the sum of the
micro-batch losses is then exactly the full-batch loss, so gradient accumulation is exact.

References:
- GRPO: Shao et al. 2024, "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
  Models" (group-relative advantages, PPO clip, k3 KL to a reference, per-sequence mean).
- DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale" (clip-higher
  eps_high > eps, token-level normalisation, dropping zero-variance groups).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective" (no std
  scaling, a constant normaliser instead of the sequence length).
- TIS: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
  (truncated importance sampling between the trainer and the sampler, C = 2).
- MIS: Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
  Mismatch" (masked importance sampling: tokens whose weight passes C are left out, not clipped).
- Decoupled PPO: Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
  Language Reasoning" (the proximal policy pi_prox separates the trust region from the behaviour policy).
- CISPO: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention"
  (clip the stop-gradient importance weight, not the update, so every token keeps a gradient).

Deviations from the papers, all deliberate:
1. pi_old is the SAMPLER's logprob (from the inference engine), not a recomputation by the trainer.
   We do one optimiser step per batch, so the ratio measures engine/trainer mismatch (numerics, bf16,
   batching) rather than staleness across PPO epochs. A NaN old logprob (the server returned none)
   means "on policy": rho = 1 with the gradient of log pi kept.
2. KL is the k3 estimator added to the loss (GRPO), not folded into the advantage (ART), and the
   reference is the base model with the adapter disabled, or a checkpoint's adapter of the same run
   (e.g. the SFT warm start, which a KL to the base would pull the policy away from), not a frozen
   copy of the model.
3. CISPO also clips below (1 - eps); the paper only bounds the weight above. Pass eps=1.0 to get the
   paper's one-sided clip (the weight is never negative).
4. GRPO's per-sequence mean is `normalize="sequence"`; DAPO's token mean is the default in TrainConfig.
   Dr. GRPO's constant is `max_len` times the number of sequences of the step (their (1/G) sum_i over a
   group, generalised to several groups).
5. Advantages (training/advantages.py) use the population std (N, not N - 1) plus 1e-6; zero-variance
   groups are dropped (DAPO's dynamic sampling without the resampling), but a rollout whose advantage
   is exactly 0 inside a varied group is kept: its tokens count in the token normaliser.
6. One optimiser step per batch (GRPO's mu = 1); no PPO epochs over the same rollouts.
7. TIS and MIS weigh single tokens against the cap (the papers' token-level variants); MIS's mask is
   one-sided like TIS's cap: a token the behaviour policy found much likelier than pi has w < 1 and
   only a small weight, not an unbounded one. A NaN behaviour logprob has w = 1.
8. Every ratio is formed in log space and its log is bounded before it is exponentiated:

       rho_bt = exp(clamp(log pi - log pi_old, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
       w_bt   = exp(clamp(sg[log pi] - log mu, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
       q_bt   = clamp(log pi_ref - log pi, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)

   Why: a sampler's logprob is any finite number the trainer is handed (a sampler of another model, a
   stale adapter, float32's -3.4e38), and exp of a gap of 89 nats is already past float32: the ratio
   was inf, its mean ``Infinity`` in the history, and with a negative advantage the loss inf, refused
   as if the learning rate were at fault. With the bound (20 nats: e^20 ~ 4.9e8, as verl bounds its
   log-ratios) every value here is finite for every finite or infinite gap, in float32 and bfloat16; a
   token past the bound keeps its bounded value and no gradient (clamp's), as a clipped token does:
   no objective above trains a token whose ratio is off by a factor of 1e8 on anything meaningful.
   TIS and MIS compare the bounded w with C, so the cap itself never meets an inf. The loss is
   computed in at least float32 (a float16 would overflow at e^11). The advantages it is handed are
   bounded too (training/advantages.py, ADVANTAGE_LIMIT), so the products and the step's sums stay
   finite: |A| e^20 C summed over a step's tokens is far below float32's 3.4e38.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from groupwise.errors import ConfigError

NORMALIZE_MODES = ("token", "sequence", "constant")


def distillation_advantages(logprobs_BT: torch.Tensor, teacher_logprobs_BT: torch.Tensor,
                            mask_BT: torch.Tensor) -> torch.Tensor:
    """D_bt = -sg[log pi(y_bt) - log pi_T(y_bt)] at the trained tokens, 0 elsewhere: the per-token negative
    reverse KL to the teacher, on the student's own sampled token (a one-sample estimate of the KL there).

    logprobs_BT:          log pi(y_bt) of the student (its gradient is dropped).     # [B, T]
    teacher_logprobs_BT:  log pi_T(y_bt) of the teacher at the same tokens.          # [B, T]
    mask_BT:              1 where y_bt is trained.                                   # [B, T]
    """
    on_mask_BT = mask_BT > 0
    reverse_kl_BT = logprobs_BT.detach() - teacher_logprobs_BT.to(logprobs_BT.dtype)
    return torch.where(on_mask_BT, -reverse_kl_BT, torch.zeros_like(reverse_kl_BT))


def topk_reverse_kl(logp_BTK: torch.Tensor, teacher_logp_BTK: torch.Tensor,
                    support_BTK: torch.Tensor) -> torch.Tensor:
    """K_bt = KL(p~ || q~) over the support S_bt, both distributions renormalised on it (module docstring).  # [B, T]

    logp_BTK:          log pi(v) of the student at the K candidate tokens v of each position (with gradient).
    teacher_logp_BTK:  log pi_T(v) of the teacher at the same tokens.
    support_BTK:       1 where the candidate is in S_bt (a token listed twice is in it once); a position
                       with no candidate in S (not trained) gets K_bt = 0.
    """
    dtype = torch.promote_types(logp_BTK.dtype, torch.float32)
    in_S_BTK = support_BTK > 0
    # Off the support: the dtype's lowest finite value, not -inf, so that a row with no support gives
    # finite numbers (and no NaN gradient) that the mask then zeroes.
    lowest = torch.finfo(dtype).min
    s_BTK = torch.where(in_S_BTK, logp_BTK.to(dtype), torch.full_like(logp_BTK, lowest, dtype=dtype))
    t_BTK = torch.where(in_S_BTK, teacher_logp_BTK.to(dtype), torch.full_like(logp_BTK, lowest, dtype=dtype))
    log_p_BTK = s_BTK - torch.logsumexp(s_BTK, dim=-1, keepdim=True)  # log p~(v)
    log_q_BTK = t_BTK - torch.logsumexp(t_BTK, dim=-1, keepdim=True)  # log q~(v)
    terms_BTK = torch.exp(log_p_BTK) * (log_p_BTK - log_q_BTK)
    return torch.where(in_S_BTK, terms_BTK, torch.zeros_like(terms_BTK)).sum(dim=-1)


OFF_POLICY_MODES = ("none", "tis", "mis")
# The bound on every log-ratio before it is exponentiated (module docstring, deviation 8): e^20 ~ 4.9e8.
LOG_RATIO_LIMIT = 20.0


def bounded_log_ratio(log_num_BT: torch.Tensor, log_den_BT: torch.Tensor) -> torch.Tensor:
    """log(num / den) from two logprobs, clamped to +-LOG_RATIO_LIMIT: its exp is finite whatever the
    inputs (a gap of 1e30, an infinite one); past the bound the gradient is 0, as past a clip."""
    return torch.clamp(log_num_BT - log_den_BT, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)


@dataclass
class LossTerms:
    """The loss of a micro-batch, and detached statistics (summed, so micro-batches add up)."""

    loss: torch.Tensor  # scalar, carries the gradient; already divided by the step's normaliser
    policy_loss_sum: torch.Tensor  # sum_bt l_bt without KL, detached
    kl_sum: torch.Tensor  # sum_bt k3_bt, detached (0 without a reference)
    clipped_tokens: torch.Tensor  # how many tokens had their ratio clipped (PPO: the clip was active)
    ratio_sum: torch.Tensor  # sum_bt exp(log pi - log mu): the ratio to the sampler, detached
    teacher_kl_sum: torch.Tensor  # sum_bt of the reverse KL to the teacher (sampled: log pi - log pi_T; top-k: K_bt), detached (0 without one)
    capped_tokens: torch.Tensor  # tokens whose importance weight was truncated (TIS) or masked (MIS)
    tokens: torch.Tensor  # number of trainable tokens in the micro-batch


def grpo_loss(
    logprobs_BT: torch.Tensor,
    old_logprobs_BT: torch.Tensor,
    advantages_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    epsilon: float,
    epsilon_high: float | None,
    cispo: bool,
    normalize: str,
    num_tokens: int,
    num_sequences: int,
    max_len: int,
    ref_logprobs_BT: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    off_policy: str = "none",
    importance_cap: float | None = None,
    teacher_logprobs_BT: torch.Tensor | None = None,
    distill_coef: float = 0.0,
    distill_kl_BT: torch.Tensor | None = None,
) -> LossTerms:
    """The GRPO/DAPO/Dr.GRPO/CISPO loss of a micro-batch (see the module docstring for the equation).

    logprobs_BT:      log pi(y_bt) under the current policy, with gradient.            # [B, T]
    old_logprobs_BT:  log pi_old(y_bt) from the sampler; NaN = on policy.             # [B, T]
    advantages_B:     A_b, one per sequence.                                           # [B]
    mask_BT:          1 where y_bt is a sampled (trainable) token, else 0.             # [B, T]
    num_tokens / num_sequences: trainable tokens / sequences of the whole step (the normalisers).
    max_len:          Dr. GRPO's constant (the step's length limit).
    ref_logprobs_BT:  log pi_ref(y_bt) (the reference policy), needed when kl_coef > 0. # [B, T]
    off_policy:       "none" (pi_old is the sampler), "tis" or "mis" (decoupled, weighted by w~_bt).
    importance_cap:   C of TIS / MIS, needed when off_policy is not "none" (TrainConfig.importance_cap
                      owns its default).
    teacher_logprobs_BT: log pi_T(y_bt) (the teacher), needed when distill_coef > 0.  # [B, T]
    distill_coef:     lambda, the weight of the distillation advantage D_bt, or of K_bt (0: GRPO alone).
    distill_kl_BT:    K_bt, the top-k reverse KL to the teacher (`topk_reverse_kl`, with gradient), added to
                      the loss in place of the advantage D_bt; give it or teacher_logprobs_BT, not both. # [B, T]
    """
    if normalize not in NORMALIZE_MODES:
        raise ConfigError(f"normalize={normalize!r} must be one of {list(NORMALIZE_MODES)}",
                          what="grpo_loss arguments")
    if off_policy not in OFF_POLICY_MODES:
        raise ConfigError(f"off_policy={off_policy!r} must be one of {list(OFF_POLICY_MODES)}",
                          what="grpo_loss arguments")
    if off_policy != "none" and not (importance_cap is not None and importance_cap > 0):
        raise ConfigError(f"off_policy={off_policy!r} needs importance_cap > 0 (C, e.g. TrainConfig.importance_cap); "
                          f"got {importance_cap!r}", what="grpo_loss arguments")
    if distill_coef > 0 and teacher_logprobs_BT is None and distill_kl_BT is None:
        raise ConfigError("distill_coef > 0 needs teacher_logprobs_BT (log-probs under the teacher) or distill_kl_BT "
                          "(the top-k reverse KL to it)", what="grpo_loss arguments")
    if teacher_logprobs_BT is not None and distill_kl_BT is not None:
        raise ConfigError("give teacher_logprobs_BT (the sampled-token estimate) or distill_kl_BT (the top-k one), "
                          "not both: one distillation term per step", what="grpo_loss arguments")
    if kl_coef > 0 and ref_logprobs_BT is None:
        raise ConfigError("kl_coef > 0 needs ref_logprobs_BT (log-probs under the reference policy)",
                          what="grpo_loss arguments")
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high
    # At least float32: float16 overflows at e^11, inside the log-ratio bound.
    dtype = torch.promote_types(logprobs_BT.dtype, torch.float32)
    logprobs_BT = logprobs_BT.to(dtype)
    mask_BT = mask_BT.to(dtype)
    # Padding and prompt positions may hold any value (even NaN); zero them before they meet a product.
    on_mask_BT = mask_BT > 0
    logprobs_BT = torch.where(on_mask_BT, logprobs_BT, torch.zeros_like(logprobs_BT))
    old_BT = old_logprobs_BT.to(dtype)
    old_BT = torch.where(torch.isnan(old_BT) | ~on_mask_BT, logprobs_BT.detach(), old_BT)
    A_BT = advantages_B.to(dtype)[:, None].expand_as(logprobs_BT)
    D_BT = torch.zeros_like(logprobs_BT, dtype=dtype)
    if teacher_logprobs_BT is not None:
        D_BT = distillation_advantages(logprobs_BT, teacher_logprobs_BT, on_mask_BT).to(dtype)
        A_BT = A_BT + distill_coef * D_BT  # detached: the teacher's score is a reward, not a target to fit

    log_w_BT = bounded_log_ratio(logprobs_BT.detach(), old_BT)  # log w_bt = log pi - log mu, [B, T]
    behaviour_ratio_BT = torch.exp(log_w_BT)  # w_bt
    weight_BT = torch.ones_like(behaviour_ratio_BT)  # w~_bt
    capped_BT = torch.zeros_like(on_mask_BT)
    if off_policy == "none":
        prox_BT = old_BT  # pi_old = mu: the sampler's policy is the trust region's anchor
    else:
        prox_BT = logprobs_BT.detach()  # pi_prox = sg[pi]: rho = 1 in value, gradient of log pi kept
        capped_BT = behaviour_ratio_BT > importance_cap  # w_bt is finite (bounded): the cap meets no inf
        if off_policy == "tis":
            weight_BT = torch.clamp(behaviour_ratio_BT, max=importance_cap)
        else:
            weight_BT = torch.where(capped_BT, torch.zeros_like(behaviour_ratio_BT), behaviour_ratio_BT)
    ratio_BT = torch.exp(bounded_log_ratio(logprobs_BT, prox_BT))  # rho_bt, [B, T]
    clipped_ratio_BT = torch.clamp(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)  # [B, T]
    if cispo:
        per_token_BT = -clipped_ratio_BT.detach() * A_BT * logprobs_BT
        clipped_BT = clipped_ratio_BT.detach() != ratio_BT.detach()
    else:
        unclipped_BT = ratio_BT * A_BT
        clipped_obj_BT = clipped_ratio_BT * A_BT
        per_token_BT = -torch.minimum(unclipped_BT, clipped_obj_BT)
        clipped_BT = clipped_obj_BT.detach() < unclipped_BT.detach()  # the clip chose the bound
    per_token_BT = weight_BT * per_token_BT
    policy_BT = per_token_BT

    kl_BT = torch.zeros_like(logprobs_BT)
    if ref_logprobs_BT is not None:
        ref_BT = torch.where(on_mask_BT, ref_logprobs_BT.to(dtype), logprobs_BT.detach())
        q_BT = bounded_log_ratio(ref_BT, logprobs_BT)  # q_bt = log pi_ref - log pi
        kl_BT = torch.exp(q_BT) - q_BT - 1.0  # k3 >= 0, unbiased for KL(pi || pi_ref)
        if kl_coef > 0:
            per_token_BT = per_token_BT + kl_coef * kl_BT

    if distill_kl_BT is not None:
        K_BT = torch.where(on_mask_BT, distill_kl_BT.to(dtype), torch.zeros_like(logprobs_BT))
        per_token_BT = per_token_BT + distill_coef * K_BT
        D_BT = -K_BT.detach()  # reported as the teacher KL, as the sampled estimate is

    masked_BT = per_token_BT * mask_BT
    if normalize == "token":
        loss = masked_BT.sum() / max(num_tokens, 1)
    elif normalize == "sequence":
        tokens_B = mask_BT.sum(dim=1).clamp(min=1.0)
        loss = (masked_BT.sum(dim=1) / tokens_B).sum() / max(num_sequences, 1)
    else:  # "constant"
        loss = masked_BT.sum() / (max(num_sequences, 1) * max_len)

    return LossTerms(
        loss=loss,
        policy_loss_sum=(policy_BT * mask_BT).sum().detach(),
        kl_sum=(kl_BT * mask_BT).sum().detach(),
        clipped_tokens=(clipped_BT.to(mask_BT.dtype) * mask_BT).sum().detach(),
        ratio_sum=(behaviour_ratio_BT * mask_BT).sum().detach(),
        teacher_kl_sum=(-D_BT * mask_BT).sum().detach(),
        capped_tokens=(capped_BT.to(mask_BT.dtype) * mask_BT).sum().detach(),
        tokens=mask_BT.sum().detach(),
    )
