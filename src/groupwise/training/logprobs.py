"""log pi(token | prefix) at the trainable positions, without ever holding [T, V] logits.

The LM head is the memory peak of an RL step: 16k trainable tokens x a 152k vocabulary is 2.5e9
logits (10 GB in fp32). So the head runs on the trainable positions only, in chunks of `chunk_size`
positions, and the gradient is formed chunk by chunk in the FORWARD pass:

    lp_n        = z_n[y_n] - logsumexp(z_n),          z_n = W h_n (+ b)         # logits [V]
    d lp_n/d h_n = W[y_n] - softmax(z_n) W            =: g_n                      # [H]

so the backward only scales the stored g_n by the incoming gradient (a scalar per token):
grad h_n = (dL/d lp_n) g_n. One chunk's [chunk, V] block is alive at a time, and the head costs two
matmuls per chunk (z = W h and softmax(z) W), against three for activation checkpointing (forward,
recompute, backward). This needs the head's weight frozen, which LoRA guarantees (the adapter never
targets the head; tied embeddings are frozen too). A trainable head (peft `modules_to_save`) takes
the checkpointed path instead (through the module, so its own terms and the weight's gradient apply).

g is kept in the hidden states' dtype (what autograd would produce in the backward of a bf16 model);
the log-softmax itself is fp32 (fp64 in an fp64 model: the accumulation tests run there).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["base_and_decoder", "head_logprobs", "scatter_rows", "token_logprobs", "topk_candidates", "trained_hidden"]


def base_and_decoder(model: Any) -> tuple[Any, Any]:
    """(the causal LM under a peft wrapper, its decoder stack: embeddings + layers + final norm)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base, base.get_decoder() if hasattr(base, "get_decoder") else base.model


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _chunk_logprobs(lm_head: torch.nn.Module, hidden_NH: torch.Tensor, targets_N: torch.Tensor) -> torch.Tensor:
    """Plain autograd: logits -> fp32 log-softmax at the targets.   # [N]"""
    logits_NV = _at_least_fp32(lm_head(hidden_NH))
    return logits_NV.gather(-1, targets_N[:, None]).squeeze(-1) - torch.logsumexp(logits_NV, dim=-1)


def _frozen_head_chunk(hidden_CH: torch.Tensor, weight_VH: torch.Tensor, bias_V: torch.Tensor | None,
                       targets_C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of `_FrozenHeadLogprobs`: (lp_C, g_CH), with one [C, V] logits block alive."""
    logits_CV = torch.nn.functional.linear(hidden_CH, weight_VH, bias_V)  # model dtype
    # Two passes over the [C, V] logits, each reading them once: the exact log-prob at the target
    # (fp32 or better), and the softmax in the model's dtype for the gradient's matmul (autograd
    # would use that dtype too). Upcasting the block first and working on it in place would move
    # several times the memory. Compiled (`compiled_head_chunk`), the
    # log-softmax is one reduction that never writes its fp32 [C, V] result.
    lsm_dtype = _at_least_fp32(logits_CV[:0]).dtype
    logprobs_C = torch.log_softmax(logits_CV, dim=-1, dtype=lsm_dtype).gather(-1, targets_C[:, None]).squeeze(-1)
    probs_CV = torch.softmax(logits_CV, dim=-1)
    del logits_CV  # eager: one [C, V] block alive at the matmul
    expected_CH = probs_CV @ weight_VH  # E_{v ~ softmax}[W_v]
    return logprobs_C, (weight_VH[targets_C] - expected_CH).to(hidden_CH.dtype)


@functools.cache
def compiled_head_chunk() -> Any:
    """`_frozen_head_chunk` under torch.compile, made once per process (TrainConfig.compile; dynamic:
    the last chunk of a step is shorter)."""
    return torch.compile(_frozen_head_chunk, dynamic=True)


class _FrozenHeadLogprobs(torch.autograd.Function):
    """lp_N = log_softmax(W h)[y] chunk by chunk, with g_NH = d lp / d h formed in the forward (module doc)."""

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, bias_V, targets_N, chunk_size: int, chunk_fn):
        N = hidden_NH.shape[0]
        logprobs_N = torch.empty(N, dtype=_at_least_fp32(hidden_NH[:0]).dtype, device=hidden_NH.device)
        grad_NH = torch.empty_like(hidden_NH)
        for a in range(0, N, chunk_size):
            b = min(N, a + chunk_size)
            logprobs_N[a:b], grad_NH[a:b] = chunk_fn(hidden_NH[a:b], weight_VH, bias_V, targets_N[a:b])
        ctx.save_for_backward(grad_NH)
        return logprobs_N

    @staticmethod
    def backward(ctx, grad_out_N):
        (grad_NH,) = ctx.saved_tensors
        return grad_out_N.to(grad_NH.dtype)[:, None] * grad_NH, None, None, None, None, None


def head_logprobs(lm_head: torch.nn.Module, hidden_NH: torch.Tensor, targets_N: torch.Tensor,
                  chunk_size: int, compile: bool = False) -> torch.Tensor:
    """log_softmax(lm_head(hidden))[target] per row, fp32, in chunks of `chunk_size` rows.   # [N]

    compile: run a frozen head's chunks compiled (`compiled_head_chunk`)."""
    N = hidden_NH.shape[0]
    if N == 0:
        return _at_least_fp32(hidden_NH.new_zeros(0))
    needs_grad = torch.is_grad_enabled() and hidden_NH.requires_grad
    # type() is exact on purpose: a peft LoRA layer on the head subclasses nothing here but is not a
    # plain Linear, and its extra terms must run through autograd.
    if needs_grad and type(lm_head) is torch.nn.Linear and not any(p.requires_grad for p in lm_head.parameters()):
        chunk_fn = compiled_head_chunk() if compile else _frozen_head_chunk
        return _FrozenHeadLogprobs.apply(hidden_NH, lm_head.weight, lm_head.bias, targets_N, chunk_size, chunk_fn)
    pieces = []
    for a in range(0, N, chunk_size):
        h, y = hidden_NH[a:a + chunk_size], targets_N[a:a + chunk_size]
        if needs_grad and a + chunk_size < N:
            # A trainable head: recompute each chunk but the last in the backward, so at most one
            # [chunk, V] block is alive (plain autograd would keep every chunk's softmax).
            pieces.append(checkpoint(_chunk_logprobs, lm_head, h, y, use_reentrant=False))
        else:
            pieces.append(_chunk_logprobs(lm_head, h, y))
    return torch.cat(pieces)


def token_logprobs(
    model: Any,
    input_ids_BT: torch.Tensor,
    attention_BT: torch.Tensor | None,
    mask_BT: torch.Tensor,
    *,
    chunk_size: int,
    target_index_N: torch.Tensor | None = None,
    compile_head: bool = False,
) -> torch.Tensor:
    """log pi(token t | tokens < t) at every position where mask_BT is set, 0 elsewhere.   # [B, T]

    `model` is a peft model or a plain causal LM; the adapter (if any) applies as currently set.
    Only the decoder runs on all positions; the LM head and log-softmax run on masked positions only.
    attention_BT None means right padding (micro_batches.collate says why no mask is needed then).
    target_index_N: the flat [B*T] indices of mask_BT's set positions, in order, when the caller
    has them (computing them here is a device sync on CUDA). compile_head: see `head_logprobs`.
    """
    B, T = input_ids_BT.shape
    if target_index_N is None:
        mask_BT = mask_BT.clone()
        mask_BT[:, 0] = False  # token 0 has no predecessor
        target_index_N = mask_BT.reshape(-1).nonzero().squeeze(1)
    hidden_NH = trained_hidden(model, input_ids_BT, attention_BT, target_index_N)
    targets_N = input_ids_BT.reshape(-1).index_select(0, target_index_N)  # [N]
    lm_head = base_and_decoder(model)[0].get_output_embeddings()
    logprobs_N = head_logprobs(lm_head, hidden_NH, targets_N, chunk_size, compile=compile_head)
    return scatter_rows(logprobs_N, target_index_N, B, T)


def trained_hidden(model: Any, input_ids_BT: torch.Tensor, attention_BT: torch.Tensor | None,
                   target_index_N: torch.Tensor) -> torch.Tensor:
    """The final hidden state that predicts each trained token: position t-1's for token t, at the flat
    [B*T] indices `target_index_N` (each t >= 1 within its row).   # [N, H]"""
    B, T = input_ids_BT.shape
    _, decoder = base_and_decoder(model)
    # use_cache=False: a training forward builds no KV cache (it would be thrown away, and with
    # compiled layers each layer's cache index would make its own compiled entry).
    hidden_BTH = decoder(input_ids=input_ids_BT, attention_mask=attention_BT, use_cache=False).last_hidden_state
    return hidden_BTH.reshape(B * T, -1).index_select(0, target_index_N - 1)


def scatter_rows(values_N: torch.Tensor, target_index_N: torch.Tensor, B: int, T: int) -> torch.Tensor:
    """values_N[n] (a scalar or a row) at flat position target_index_N[n] of a [B, T, ...] block of zeros."""
    zeros = values_N.new_zeros((B * T, *values_N.shape[1:]))
    return zeros.index_copy(0, target_index_N, values_N).view(B, T, *values_N.shape[1:])


def _logprobs_at(lm_head: torch.nn.Module, hidden_CH: torch.Tensor, index_CK: torch.Tensor, vocab: int) -> torch.Tensor:
    """log_softmax over the first `vocab` logits, at the K tokens of each row.   # [C, K]"""
    logits_CV = _at_least_fp32(lm_head(hidden_CH)[:, :vocab])
    return logits_CV.gather(-1, index_CK) - torch.logsumexp(logits_CV, dim=-1, keepdim=True)


def topk_candidates(lm_head: torch.nn.Module, hidden_NH: torch.Tensor, teacher_head: torch.nn.Module,
                    teacher_hidden_NH: torch.Tensor, *, k: int, vocab: int,
                    chunk_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The support of the top-k reverse KL (training/loss.py's `topk_reverse_kl`) at each trained position:
    the teacher's k likeliest tokens, then the student's, over the first `vocab` ids (the ones both heads
    share). Returns (logp_NK, teacher_logp_NK, support_NK), K = 2k: the student's log-probs there (with
    gradient), the teacher's (none), and 1 where the candidate is in the support (0: a student candidate the
    teacher's k already list, so the union counts it once).

    Chunk by chunk, as `head_logprobs`: the indices and the teacher's values come from a no-grad pass; the
    student's log-probs at those indices are recomputed in the backward (activation checkpointing), so no
    [chunk, V] block outlives its chunk.
    """
    k = min(k, vocab)
    logp, teacher_logp, support = [], [], []
    needs_grad = torch.is_grad_enabled() and hidden_NH.requires_grad
    for a in range(0, hidden_NH.shape[0], chunk_size):
        h_CH, t_CH = hidden_NH[a:a + chunk_size], teacher_hidden_NH[a:a + chunk_size]
        with torch.no_grad():
            teacher_CV = _at_least_fp32(teacher_head(t_CH)[:, :vocab])
            teacher_CK = teacher_CV.topk(k, dim=-1).indices
            student_CK = lm_head(h_CH)[:, :vocab].topk(k, dim=-1).indices
            index_CK = torch.cat([teacher_CK, student_CK], dim=-1)
            listed_Ck = (student_CK[:, :, None] == teacher_CK[:, None, :]).any(-1)
            support.append(torch.cat([torch.ones_like(listed_Ck), ~listed_Ck], dim=-1))
            teacher_logp.append(teacher_CV.gather(-1, index_CK) - torch.logsumexp(teacher_CV, dim=-1, keepdim=True))
            del teacher_CV
        if needs_grad:
            logp.append(checkpoint(_logprobs_at, lm_head, h_CH, index_CK, vocab, use_reentrant=False))
        else:
            logp.append(_logprobs_at(lm_head, h_CH, index_CK, vocab))
    if not logp:
        empty = _at_least_fp32(hidden_NH.new_zeros((0, 2 * k)))
        return empty, empty, empty.bool()
    return torch.cat(logp), torch.cat(teacher_logp), torch.cat(support)
