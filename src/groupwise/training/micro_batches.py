"""A step's micro-batches: which sequences train together, their padded tensors, and the loss terms summed
over them.

Micro-batches are sized by a token budget (padded tokens, `TrainConfig.micro_batch_tokens`); sequences
are sorted by length so padding is small. The trainer (training/trainer.py) and the joint update of
several runs (training/joint.py) plan, collate and sum with these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch

from groupwise.training.loss import LossTerms
from groupwise.training.tokenize import TokenizedSequence

__all__ = ["StepStats", "collate", "plan_micro_batches", "stat_terms"]


def plan_micro_batches(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Indices of sequences per micro-batch: longest first, each batch's n * max_len <= budget.

    A sequence longer than the budget gets a micro-batch of its own (it cannot be split).
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]  # first is the longest
        if current and (len(current) + 1) * width > token_budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def collate(seqs: list[TokenizedSequence], pad_id: int, device: torch.device) -> dict[str, Any]:
    """Right-padded [B, T] tensors of a micro-batch, plus the flat indices of its trained tokens.

    No attention mask: every row's real tokens come first, so under the causal mask a real token
    never sees a pad, and pad positions are never trained. Without a mask SDPA runs its causal
    kernel (with grouped-query heads natively) instead of a masked one over repeated K/V heads.
    The indices are found here, on the CPU: finding them on the GPU (nonzero) would stall the
    forward on a device sync. Each field crosses from Python in one conversion of the rows joined,
    placed by one masked write (row-major, the rows' order): a conversion per row and field cost
    ~8 ms for 64 rows on a 2-core CPU, before the update's first kernel.
    """
    lengths = [len(s) for s in seqs]
    B, T = len(seqs), max(lengths)
    real_BT = torch.arange(T) < torch.tensor(lengths)[:, None]  # a row's real tokens: its first len(s) positions
    input_ids_BT = torch.full((B, T), pad_id, dtype=torch.long)
    input_ids_BT[real_BT] = torch.tensor(list(chain.from_iterable(s.input_ids for s in seqs)), dtype=torch.long)
    mask_BT = torch.zeros((B, T), dtype=torch.bool)
    mask_BT[real_BT] = torch.tensor(list(chain.from_iterable(s.mask for s in seqs)), dtype=torch.bool)
    old_BT = torch.full((B, T), math.nan, dtype=torch.float64)
    old_BT[real_BT] = torch.tensor(list(chain.from_iterable(s.old_logprobs for s in seqs)), dtype=torch.float64)
    mask_BT[:, 0] = False  # token 0 has no predecessor, so no log-prob
    advantages_B = torch.tensor([s.advantage for s in seqs], dtype=torch.float64)
    target_index_N = mask_BT.reshape(-1).nonzero().squeeze(1)  # flat [B*T] positions of trained tokens
    return {
        "input_ids_BT": input_ids_BT.to(device),
        "attention_BT": None,
        "mask_BT": mask_BT.to(device),
        "target_index_N": target_index_N.to(device),
        "old_logprobs_BT": old_BT.to(device),
        "advantages_B": advantages_B.to(device),
    }


@dataclass
class StepStats:
    loss: float = 0.0
    policy_loss_sum: float = 0.0
    kl_sum: float = 0.0
    teacher_kl_sum: float = 0.0
    clipped_tokens: float = 0.0
    ratio_sum: float = 0.0
    tokens: float = 0.0
    capped_tokens: float = 0.0  # importance weights truncated (TIS) or masked (MIS)


def stat_terms(terms: LossTerms) -> torch.Tensor:
    """A micro-batch's loss terms in `StepStats`' order, summed over micro-batches on the device."""
    return torch.stack([terms.loss.detach(), terms.policy_loss_sum, terms.kl_sum, terms.teacher_kl_sum,
                        terms.clipped_tokens, terms.ratio_sum, terms.tokens, terms.capped_tokens]).double()
