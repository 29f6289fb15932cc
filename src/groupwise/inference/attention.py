"""Decode attention without copying K/V once per query head (grouped-query attention).

Qwen2.5-0.5B has 14 query heads and 2 K/V heads. transformers' SDPA path, given an explicit mask
(the engine always passes one: its rows have different lengths), repeats K and V up to 14 heads
(``repeat_kv``) because torch's masked GQA falls back to the math kernel on CUDA. For decode that
copy costs more than the attention itself: about half of a large eager decode step on a GPU.

With one query token the repeat is unnecessary: the G = H / H_kv query heads that share a K/V head
are G queries against the same keys, so (query [B, H, 1, D] viewed as [B, H_kv, G, D])::

    out[b, j*G + g] = softmax(q[b, j, g] . K[b, j]^T * scale + mask[b]) V[b, j]

is one SDPA call over H_kv heads with G query rows, the mask [B, 1, 1, L] broadcast over both. The
same function, the same numbers up to summation order. Recent transformers (5.24) does this itself
(``pack_gqa``); older versions (5.17) do not, so the engine installs this for its
own forward passes (`engine_attention`). Everything else (prefill, a mask per head, the trainer's
forward) goes to transformers' own SDPA function unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

from groupwise.runtime.attention_backends import varying_shape_attention

__all__ = ["ENGINE_ATTENTION", "ROWS_ATTENTION", "decode_gqa_sdpa", "engine_attention", "rows_sdpa"]

ENGINE_ATTENTION = "groupwise_sdpa"
ROWS_ATTENTION = "groupwise_sdpa_rows"  # the batch-invariant mode's (`rows_sdpa`)


def decode_gqa_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, H, Q, D], key/value [B, H_kv, L, D];
    returns ([B, Q, H, D], None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    B, H, Q, D = query.shape
    if (Q != 1 or groups == 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1] != 1
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("sliding_window") or dropout or key.shape[-1] != value.shape[-1]):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    q_BKGD = query.reshape(B, H // groups, groups, D)  # query head h = j*G + g uses K/V head j
    out_BKGD = torch.nn.functional.scaled_dot_product_attention(q_BKGD, key, value, attn_mask=attention_mask,
                                                                scale=scaling)
    return out_BKGD.reshape(B, 1, H, D), None


def rows_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """`decode_gqa_sdpa` for the batch-invariant mode: each decode row attends over exactly its own
    columns, in a call of its own.

    CPU attention sums a row's scores and values in an order that depends on the number of columns,
    masked ones included, and a decode batch has as many columns as its longest row: a row's output
    changed (by ulps) with the rows beside it. Per row, the call's shape is the row's alone.
    Prefill passes (Q > 1) run one request each in this mode (prefill.py) and go to `decode_gqa_sdpa`.
    """
    B, H, Q, D = query.shape
    if (Q != 1 or attention_mask is None or attention_mask.dim() != 4 or attention_mask.shape[1:3] != (1, 1)
            or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("sliding_window") or dropout or key.shape[-1] != value.shape[-1]):
        return decode_gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                               is_causal=is_causal, **kwargs)
    visible_BL = attention_mask[:, 0, 0] if attention_mask.dtype == torch.bool else attention_mask[:, 0, 0] == 0
    lengths = visible_BL.sum(-1).tolist()  # the decode mask is a prefix of columns: its length
    groups = int(getattr(module, "num_key_value_groups", 1))
    out_BQHD = query.new_empty(B, 1, H, D)
    for b, n in enumerate(lengths):
        q_1KGD = query[b:b + 1].reshape(1, H // groups, groups, D)
        o = torch.nn.functional.scaled_dot_product_attention(q_1KGD, key[b:b + 1, :, :n], value[b:b + 1, :, :n],
                                                             scale=scaling)
        out_BQHD[b] = o.reshape(1, H, D)
    return out_BQHD, None


_registered = False


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ENGINE_ATTENTION, decode_gqa_sdpa)
    AttentionMaskInterface.register(ENGINE_ATTENTION, sdpa_mask)
    AttentionInterface.register(ROWS_ATTENTION, rows_sdpa)
    AttentionMaskInterface.register(ROWS_ATTENTION, sdpa_mask)
    _registered = True


@contextlib.contextmanager
def engine_attention(config: Any, rows_invariant: bool = False) -> Iterator[None]:
    """Use `decode_gqa_sdpa` (`rows_sdpa` when `rows_invariant`) for the forward passes inside, where
    the model runs transformers' SDPA.

    The switch is the config's attribute (read by every attention layer per call), set for the
    engine's passes only: the trainer shares the model and keeps its own attention. A captured CUDA
    graph keeps what ran at capture. The passes run without cuDNN's attention kernel, which builds a
    graph for each new shape (groupwise/runtime/attention_backends.py): prefill shapes change every pass."""
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        yield
        return
    _register()
    config._attn_implementation = ROWS_ATTENTION if rows_invariant else ENGINE_ATTENTION
    try:
        with varying_shape_attention():
            yield
    finally:
        config._attn_implementation = "sdpa"
