"""Serving one LoRA adapter on the CPU from merged weights: W' = W + s B A for each adapted Linear.

Why. On the CPU a LoRA layer's two extra matmuls are tiny ([rows, 576] x [576, 8] for SmolLM2) and
cost their fixed overhead, not their FLOPs: about a third of a small decode step. A merged copy of
the adapted weights runs the base model's forward, so the adapter is free at decode time.

How. The engine keeps at most ONE merged copy, for the adapter of its latest single-adapter batch
(a training run serves one step at a time). For a forward pass it points each adapted layer's base
weight at the merged tensor (`Parameter.data`, swapped back after), with peft's adapters off.
The copy is rebuilt when another adapter is served, and dropped whenever adapter weights may have
changed: an adapter added or removed, the end of a pause in which the trainer may have stepped
(`Engine._weights_changed`).

Cost: memory for the adapted weights (425 MB for SmolLM2 in fp32), so the engine merges by default
on the CPU only, and only when that copy is at most `DEFAULT_MAX_BYTES`. The result equals peft's
to fp32 rounding (x (W + sBA)^T vs x W^T + s (x A^T) B^T), the size of the difference between two
summation orders; the logprobs reported stay the model's own to ~1e-6.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch

__all__ = ["DEFAULT_MAX_BYTES", "MergedAdapter", "plain_lora"]

DEFAULT_MAX_BYTES = 2 << 30


def plain_lora(layer: Any, adapter: str) -> bool:
    """A plain Linear base with a vanilla LoRA of `adapter`: what W x + s B A x computes exactly, so
    both a merged copy (here) and the stacked slots of a mixed batch (stacked_lora.py) can serve it."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft comes with the backend extra
        return False
    return (type(layer) is LoraLinear and type(layer.base_layer) is torch.nn.Linear and not layer.merged
            and not getattr(layer, "fan_in_fan_out", False) and adapter not in getattr(layer, "lora_variant", {})
            and type(layer.lora_A[adapter]) is torch.nn.Linear and layer.lora_B[adapter].bias is None)


class MergedAdapter:
    """One adapter's merged weights, swapped into the shared model for the engine's forward passes."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        self.max_bytes = max_bytes
        self.adapter: str | None = None
        self._merged: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (base weight, merged tensor)
        self._usable: dict[str, bool] = {}
        # The merged tensors' memory, kept across rebuilds: a fresh 425 MB allocation per training step
        # was mostly page faults (merging itself is ~2 GFLOP).
        self._buffers: dict[torch.nn.Parameter, torch.Tensor] = {}

    def invalidate(self) -> None:
        self.adapter, self._merged, self._usable = None, [], {}

    def usable(self, layers: list[Any], adapter: str) -> bool:
        """Every layer that has `adapter` can be merged, and the copy fits `max_bytes` (cached)."""
        if adapter not in self._usable:
            self._usable[adapter] = self._check(layers, adapter)
        return self._usable[adapter]

    def _check(self, layers: list[Any], adapter: str) -> bool:
        with_adapter = [m for m in layers if adapter in getattr(m, "lora_A", {})]
        if not with_adapter or not all(plain_lora(m, adapter) for m in with_adapter):
            return False
        w = with_adapter[0].base_layer.weight
        return sum(m.base_layer.weight.numel() for m in with_adapter) * w.element_size() <= self.max_bytes

    def _build(self, layers: list[Any], adapter: str) -> None:
        merged = []
        with torch.no_grad():
            for m in layers:
                if adapter not in getattr(m, "lora_A", {}):
                    continue
                base = m.base_layer.weight  # [out, in]
                a, b = m.lora_A[adapter].weight, m.lora_B[adapter].weight  # [r, in], [out, r]
                out = self._buffers.get(base)
                if out is None or out.shape != base.shape or out.dtype != base.dtype:
                    out = self._buffers[base] = torch.empty_like(base)
                torch.addmm(base, b.to(base.dtype), a.to(base.dtype), alpha=m.scaling[adapter], out=out)
                merged.append((base, out))
        self.adapter, self._merged = adapter, merged

    @contextlib.contextmanager
    def serving(self, layers: list[Any], adapter: str) -> Iterator[None]:
        """Inside: each adapted layer's base weight holds W + sBA of `adapter` (the caller turns
        peft's adapters off meanwhile: `ModelRunner.one_adapter`)."""
        if self.adapter != adapter:
            self._build(layers, adapter)
        originals = [base.data for base, _ in self._merged]
        for base, merged in self._merged:
            base.data = merged
        try:
            yield
        finally:
            for (base, _), original in zip(self._merged, originals):
                base.data = original
