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
What a decode pass of a few hundred rows pays for is its kernels' count and the matmuls' dtype:
the stack is kept in the base's dtype (`_dtype`: bf16 matmuls on the tensor cores, no casts),
layers of one parent module that read one input (a block's q/k/v projections, an MLP's gate and
up) share an A buffer and multiply and mask that input once (`_Group`), and each layer adds its
low-rank term to the base output in place, in the second matmul's own epilogue (``addmm_``). The
stacked copy (the slots' LoRA weights once more) is refreshed in place whenever adapter weights may
have changed (`invalidate`, with the engine's merged copy), so captured graphs stay valid; a
new slot changes the shapes and drops the mixed graphs (`ModelRunner.mixed_ctx`).

Exactness: the masked columns add exact zeros, but a longer reduction may sum in another order
than peft's per-adapter matmul, so a row's numbers can differ from peft's in the last bits; on a
bf16 base the low-rank terms are computed from bf16 inputs and weights where peft computes them in the
adapters' fp32 (a difference far below the base's own bf16 rounding). A
batch-invariant engine therefore keeps peft's path (a row's numbers must not depend on its mates).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from groupwise.inference.merged import plain_lora

__all__ = ["StackedLora"]


class _Group:
    """The A buffer of sibling layers (children of one module, of one input size and dtype) and, within
    a pass, the last input it was applied to with its masked product. A layer whose columns that
    product covers, called with that same tensor, takes them instead of casting and multiplying again;
    otherwise (the first sibling, or o_proj beside q_proj: another input) it computes the product of
    its own and the later siblings' columns. So the result is right whatever the model's wiring, and a
    block's q/k/v (or an MLP's gate and up) cost one product."""

    def __init__(self, rows: int, like: torch.Tensor, dtype: torch.dtype) -> None:
        self.A = torch.empty((rows, like.shape[1]), dtype=dtype, device=like.device)
        self.col_slot = torch.empty(0, dtype=torch.long, device=like.device)  # the slot of each row of A
        self.mask: torch.Tensor | None = None  # this pass's [N, rows] mask
        self.last: tuple[torch.Tensor, int, torch.Tensor] | None = None  # (input, first row, product)

    def columns(self, x: torch.Tensor, cols: slice) -> torch.Tensor:
        """m_N * (A[cols] x_N): [N, ..., cols], a view of a product shared with the later siblings."""
        last = self.last
        if last is None or last[0] is not x or last[1] > cols.start:
            mask = self.mask
            assert mask is not None, "a stacked layer ran outside StackedLora.serving"
            h = F.linear(x.to(self.A.dtype), self.A[cols.start:])
            h.mul_(mask[:, cols.start:].view(mask.shape[0], *([1] * (h.dim() - 2)), mask.shape[1] - cols.start))
            last = self.last = (x, cols.start, h)
        return last[2][..., cols.start - last[1] : cols.stop - last[1]]


class _Layer:
    """One adapted layer's stacked slots: A_cat [S*r, in] (rows `cols` of its group's A), B_cat
    [out, S*r], and the slot of each column."""

    def __init__(self, layer: Any, slots: list[str], group: _Group, cols: slice) -> None:
        self.layer = layer
        self.names = [s for s in slots if s in layer.lora_A]
        a = [layer.lora_A[s].weight for s in self.names]
        self.group, self.cols = group, cols
        self.A = group.A[cols]
        self.B = torch.empty((layer.lora_B[self.names[0]].weight.shape[0], self.A.shape[0]), dtype=self.A.dtype,
                             device=self.A.device)
        self.layout = tuple(slots.index(s) for s, w in zip(self.names, a) for _ in range(w.shape[0]))
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


def _stack(layers: list[Any], slots: list[str], parent_of: dict[int, int]) -> list[_Layer]:
    """The stacked layers, in the model's order; siblings of one parent module with the same input size,
    dtype and device share a `_Group`. Groups of the same column layout share one slot-index tensor
    (and so, per pass, one mask)."""
    members: dict[tuple, list[tuple[Any, torch.Tensor, int]]] = {}
    for m in layers:
        a = [m.lora_A[s].weight for s in slots if s in m.lora_A]
        if a:
            key = (parent_of.get(id(m), id(m)), a[0].shape[1], _dtype(m, a[0]), a[0].device)
            members.setdefault(key, []).append((m, a[0], sum(w.shape[0] for w in a)))
    stacked: dict[int, _Layer] = {}
    layouts: dict[tuple, torch.Tensor] = {}
    for key, group_members in members.items():
        group = _Group(sum(r for _, _, r in group_members), group_members[0][1], key[2])
        at, layout = 0, ()
        for m, _, r in group_members:
            entry = stacked[id(m)] = _Layer(m, slots, group, slice(at, at + r))
            layout += entry.layout
            at += r
        if layout not in layouts:
            layouts[layout] = torch.tensor(layout, dtype=torch.long, device=group.A.device)
        group.col_slot = layouts[layout]
    return [stacked[id(m)] for m in layers if id(m) in stacked]


def _dtype(layer: Any, a: torch.Tensor) -> torch.dtype:
    """The stack's dtype: the base layer's (bf16 on a GPU), whatever dtype the adapters are kept in. The
    low-rank terms then run on the tensor cores as the base's matmul does, with no cast of the input or
    the result; in the adapters' fp32 beside a bf16 base, those matmuls and casts took longer than the
    base's whole decode pass (docs/benchmarks.md). They are rounded to the base's precision, as the
    serving engines of the field (vLLM, SGLang) compute them; a float32 base computes them in float32."""
    base = getattr(getattr(layer, "base_layer", None), "weight", None)
    return base.dtype if isinstance(base, torch.Tensor) and base.is_floating_point() else a.dtype


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

    def prepare(self, layers: list[Any], slots: list[str], parent_of: Callable[[], dict[int, int]] | None = None) -> bool | None:
        """Make the stack current for `slots`; returns None when it cannot serve them (an adapter that
        is not a plain LoRA), True when the buffers were reallocated (graphs captured on the old ones
        must go), False when refreshed in place or already current. `parent_of`: id(layer) -> id of
        its parent module, asked for only when the stack is built (siblings share a `_Group`); without
        it each layer is a group of its own."""
        if slots != self.slots or self._usable is None:
            self._usable = bool(slots) and all(plain_lora(m, s) for m in layers for s in slots if s in m.lora_A)
            if not self._usable:
                self.slots, self._layers = list(slots), []
                return None
            self.slots = list(slots)
            self._layers = _stack(layers, self.slots, parent_of() if parent_of is not None else {})
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
        groups = list({id(e.group): e.group for e in self._layers}.values())
        masks: dict[int, torch.Tensor] = {}
        for g in groups:
            key = id(g.col_slot)
            if key not in masks:
                masks[key] = (row_slot_N[:, None] == g.col_slot[None, :]).to(g.A.dtype)  # [N, rows]
            g.mask, g.last = masks[key], None
        for entry in self._layers:
            entry.layer.forward = _forward(entry)
        try:
            yield
        finally:
            for entry in self._layers:
                del entry.layer.forward  # the class's forward again
            for g in groups:
                g.mask = g.last = None  # no pass's tensors kept past it


def _forward(entry: _Layer) -> Any:
    layer, group, cols, B = entry.layer, entry.group, entry.cols, entry.B

    def forward(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        y = layer.base_layer(x, *args, **kwargs)
        h = group.columns(x, cols)  # [N, ..., S*r]
        if y.is_contiguous() and y.dtype == B.dtype:
            # y += h B^T as one GEMM with the sum in its epilogue: one kernel per adapted layer fewer in
            # every pass (168 a decode pass on a 0.5B model, each a launch inside the graph), and the
            # low-rank term is added before it is rounded instead of rounded and then added
            y.view(-1, y.shape[-1]).addmm_(h.reshape(-1, h.shape[-1]), B.t())
            return y
        return y.add_(F.linear(h, B))  # in the base's dtype

    return forward
