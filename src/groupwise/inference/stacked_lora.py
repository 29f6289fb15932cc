"""Mixed-adapter batches in one fixed pass: each layer's slot adapters stacked, each row masked to its own.

Why. Several runs on one base (a sweep) and an asynchronous loop (batches sampled by several policy
versions) put rows of different adapters into one engine batch. peft serves such a batch by
splitting it per adapter in every adapted layer with Python-list indexing: a host-to-device copy
and a handful of small launches per adapter per layer, and nothing a CUDA graph can capture, so
the batch also loses the decode graphs. Here each adapted Linear computes

    y_N = W x_N + B_cat (m_N * (A_cat x_N))

with A_cat [S*r, in] the A matrices of the layer's S slot adapters stacked, B_cat [out, S*r] their B
matrices times their LoRA scales, and m_N [S*r] one on the r columns of row N's own slot (zero
everywhere for a row on the base model). A row's slot is an index tensor, so the pass is the same
kernels whatever the mix: a graph captures it with the row slots as one more static input.

Cost: the two LoRA matmuls run over every slot's columns (S*r instead of r): cheap next to the
base weights at a sweep's ranks and slot counts, and far cheaper than peft's per-adapter split.
The stacked copy (the slots' LoRA weights once more) is refreshed in place whenever adapter weights
may have changed (`invalidate`, with the engine's merged copy), so captured graphs stay valid; a
new slot changes the shapes and drops the mixed graphs (`ModelRunner.mixed_ctx`).

Exactness: the masked columns add exact zeros, but a longer reduction may sum in another order
than peft's per-adapter matmul, so a row's numbers can differ from peft's in the last bits. A
batch-invariant engine therefore keeps peft's path (a row's numbers must not depend on its mates).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from groupwise.inference.merged import plain_lora

__all__ = ["StackedLora"]


class _Layer:
    """One adapted layer's stacked slots: A_cat [S*r, in], B_cat [out, S*r], and the slot of each column."""

    def __init__(self, layer: Any, slots: list[str], col_slots: dict[tuple, torch.Tensor]) -> None:
        self.layer = layer
        self.names = [s for s in slots if s in layer.lora_A]
        a = [layer.lora_A[s].weight for s in self.names]
        self.A = torch.empty((sum(w.shape[0] for w in a), a[0].shape[1]), dtype=a[0].dtype, device=a[0].device)
        self.B = torch.empty((layer.lora_B[self.names[0]].weight.shape[0], self.A.shape[0]), dtype=self.A.dtype,
                             device=self.A.device)
        cols = tuple(slots.index(s) for s, w in zip(self.names, a) for _ in range(w.shape[0]))
        if cols not in col_slots:  # layers of one column layout share it (and, per pass, its mask)
            col_slots[cols] = torch.tensor(cols, dtype=torch.long, device=self.A.device)
        self.col_slot = col_slots[cols]
        # each slot's rows of A_cat and columns of B_cat (views: the buffers keep their addresses)
        self.A_parts, self.B_parts, at = [], [], 0
        for w in a:
            r = w.shape[0]
            self.A_parts.append(self.A[at : at + r])
            self.B_parts.append(self.B[:, at : at + r])
            at += r

    def sources(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[float]]:
        """The slots' current A and B weights and LoRA scales, in the order of `A_parts` / `B_parts`."""
        m = self.layer
        return ([m.lora_A[s].weight for s in self.names], [m.lora_B[s].weight for s in self.names],
                [m.scaling[s] for s in self.names])


def _fill(layers: list[_Layer]) -> None:
    """Copy every layer's slot weights into its stacked buffers (B times its scale) in three
    multi-tensor ops: a refill follows every training step, and one copy per layer and slot (168
    layers x the slots on a 0.5B model) was thousands of launches on the thread that steps the engine."""
    dst_A, dst_B, src_A, src_B, scales = [], [], [], [], []
    for entry in layers:
        a, b, s = entry.sources()
        dst_A += entry.A_parts
        dst_B += entry.B_parts
        src_A += a
        src_B += b
        scales += s
    if not dst_A:
        return
    with torch.no_grad():
        torch._foreach_copy_(dst_A, src_A)
        torch._foreach_copy_(dst_B, torch._foreach_mul(src_B, scales))


class StackedLora:
    """The stacked slot adapters of a runner's model, and the context that serves a mixed batch from them."""

    def __init__(self) -> None:
        self.slots: list[str] = []  # the stacked slots, in index order (a row names its slot by index)
        self._layers: list[_Layer] = []
        self._stale = True
        self._usable: bool | None = None

    def invalidate(self) -> None:
        """Adapter weights may have changed (a step trained, a slot refilled): refill before the next use."""
        self._stale = True

    def prepare(self, layers: list[Any], slots: list[str]) -> bool | None:
        """Make the stack current for `slots`; returns None when it cannot serve them (an adapter that
        is not a plain LoRA), True when the buffers were reallocated (graphs captured on the old ones
        must go), False when refreshed in place or already current."""
        if slots != self.slots or self._usable is None:
            self._usable = bool(slots) and all(plain_lora(m, s) for m in layers for s in slots if s in m.lora_A)
            if not self._usable:
                self.slots, self._layers = list(slots), []
                return None
            self.slots = list(slots)
            col_slots: dict[tuple, torch.Tensor] = {}
            self._layers = [_Layer(m, self.slots, col_slots) for m in layers if any(s in m.lora_A for s in self.slots)]
            _fill(self._layers)
            self._stale = False
            return True
        if not self._usable:
            return None
        if self._stale:
            _fill(self._layers)
            self._stale = False
        return False

    def index(self, slot: str | None) -> int:
        """A row's slot index (-1: the base model, no adapter)."""
        return self.slots.index(slot) if slot in self.slots else -1

    @contextlib.contextmanager
    def serving(self, row_slot_N: torch.Tensor) -> Iterator[None]:
        """Inside, each stacked layer computes its rows' own adapters (`row_slot_N`: one slot index
        per batch row, -1 for the base). Used around the engine's forward pass and graph captures."""
        masks: dict[int, torch.Tensor] = {}
        for entry in self._layers:
            key = id(entry.col_slot)
            if key not in masks:
                masks[key] = (row_slot_N[:, None] == entry.col_slot[None, :]).to(entry.A.dtype)  # [N, S*r]
        for entry in self._layers:
            entry.layer.forward = _forward(entry, masks[id(entry.col_slot)])
        try:
            yield
        finally:
            for entry in self._layers:
                del entry.layer.forward  # the class's forward again


def _forward(entry: _Layer, mask_NC: torch.Tensor) -> Any:
    layer, A, B = entry.layer, entry.A, entry.B

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        y = layer.base_layer(x, *args, **kwargs)
        h = F.linear(x.to(A.dtype), A)  # [N, ..., S*r]
        h = h * mask_NC.view(mask_NC.shape[0], *([1] * (h.dim() - 2)), mask_NC.shape[1])
        return y + F.linear(h, B).to(y.dtype)

    return forward
