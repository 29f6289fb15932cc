"""A slot KV cache: one preallocated row ("slot") per running sequence, written at per-row columns.

transformers' own caches write every row of a batch at the same column (`StaticCache`) or grow by
concatenation (`DynamicCache`); continuous batching needs rows that joined at different times to
sit side by side, each at its own length. So the engine owns the buffers::

    keys[layer], values[layer]   # [S, H_kv, L, D]   S slots, L columns (capacity)

and hands the model a `SlotCache` view for one forward pass: rows ``s0 .. s0+n`` of the buffers,
each query token written at its own column (``cols_NQ``), and attention reads the first
``length`` columns through a 4-D boolean mask the engine builds. The last column (L - 1) is a
trash column: padding queries write there and it is never read (``length`` <= L - 1).

The buffers never move while their capacity is unchanged, so on CUDA a captured graph of the
decode step stays valid across steps (engine.py).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["SlotBuffers", "SlotCache"]


class SlotBuffers:
    """The preallocated K/V tensors of all layers, grown (by doubling columns) when needed."""

    def __init__(self, num_layers: int, slots: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device, max_capacity: int | None = None):
        self.num_layers, self.slots, self.kv_heads, self.head_dim = num_layers, slots, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.max_capacity = max_capacity  # doubling stops here (the engine's context, or its memory budget)
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.grow(capacity)

    def grow(self, capacity: int) -> bool:
        """Make room for `capacity` columns (plus the trash column). True when buffers were reallocated.
        The old buffers live beside the new ones until copied: for a moment, up to twice the final size."""
        if self.fits(capacity):
            return False
        new_cap = self._next_capacity(self.capacity, capacity)
        shape = (self.slots, self.kv_heads, new_cap, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.num_layers)]
        if self.capacity:
            keep = self.capacity - 1  # the old trash column is not copied
            for new, old in zip(keys + values, self.keys + self.values):
                new[:, :, :keep] = old[:, :, :keep]
        self.keys, self.values, self.capacity = keys, values, new_cap
        return True

    def fits(self, capacity: int) -> bool:
        """Whether `capacity` columns (plus the trash column) fit without `grow` reallocating."""
        return capacity + 1 <= self.capacity

    def _next_capacity(self, current: int, capacity: int) -> int:
        """The capacity `grow(capacity)` reallocates to from `current`: doubled, at least what is asked."""
        doubled = 2 * current if self.max_capacity is None else min(2 * current, self.max_capacity)
        return max(capacity + 1, doubled)

    def growth_to(self, capacity: int) -> tuple[int, int]:
        """(the capacity, the capacity before its last reallocation) once sequences have grown a column at
        a time, as decoding grows them, until `capacity` columns fit; (now, now) when they fit already.
        What admitting a sequence of that length will make the buffers hold (inference/batch_memory.py)."""
        before = current = self.capacity
        while capacity + 1 > current:
            grown = self._next_capacity(current, current)
            before, current = current, grown if grown > current + 1 else capacity + 1  # past max_capacity: at once
        return current, before

    def column_bytes(self) -> int:
        """Bytes of one column of every slot and layer, keys and values."""
        return 2 * self.num_layers * self.slots * self.kv_heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    def release(self) -> int:
        """Free the buffers (no sequence may be in them); returns the capacity to `restore` later."""
        capacity, self.keys, self.values, self.capacity = self.capacity, [], [], 0
        return capacity

    def restore(self, capacity: int) -> None:
        """Allocate released buffers again, at their old capacity (their contents are gone)."""
        if capacity and not self.capacity:
            self.grow(capacity - 1)

    @property
    def trash_col(self) -> int:
        return self.capacity - 1

    def move_slots(self, srcs: list[int], dsts: list[int], length: int) -> None:
        """Copy the first `length` columns of each slot of `srcs` into the slot of `dsts` at its index
        (compaction after finishes; no slot is both a source and a destination). One indexed copy per
        buffer for all the moves: a copy per move and buffer was 2 x layers launches per finished row, on
        the thread that steps the engine while the device waits."""
        if not srcs:
            return
        src = torch.tensor(srcs, dtype=torch.long, device=self.device)
        dst = torch.tensor(dsts, dtype=torch.long, device=self.device)
        for buf in self.keys + self.values:
            buf[dst, :, :length] = buf[src, :, :length]

    def copy_slot(self, src: int, dsts: list[int], length: int) -> None:
        """Copy a prefilled prompt into other slots (n > 1 choices share one prefill)."""
        for buf in self.keys + self.values:
            buf[dsts, :, :length] = buf[src, :, :length].unsqueeze(0)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class _SlotLayer(CacheLayerMixin):
    is_compileable = True

    def __init__(self, cache: "SlotCache", layer_idx: int):
        super().__init__()
        self._cache, self._layer_idx = cache, layer_idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states) -> None:  # buffers exist already
        return None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        c = self._cache
        k_buf = c.buffers.keys[self._layer_idx][c.s0 : c.s0 + c.n]  # [n, H, L, D] view
        v_buf = c.buffers.values[self._layer_idx][c.s0 : c.s0 + c.n]
        # key_states: [n, H, Q, D]; row r, query q goes to column cols_NQ[r, q].
        k_buf[c.rows_NQ, :, c.cols_NQ] = key_states.transpose(1, 2).to(k_buf.dtype)
        v_buf[c.rows_NQ, :, c.cols_NQ] = value_states.transpose(1, 2).to(v_buf.dtype)
        return k_buf[:, :, : c.length], v_buf[:, :, : c.length]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache.length, 0

    def get_seq_length(self) -> int:
        return self._cache.length

    def get_max_length(self) -> int:
        return self._cache.buffers.capacity - 1


class SlotCache(Cache):
    """The view of `SlotBuffers` one forward pass uses: slots [s0, s0+n), write columns cols_NQ [n, Q],
    attention over the first `length` columns."""

    def __init__(self, buffers: SlotBuffers, s0: int, n: int, cols_NQ: torch.Tensor, length: int):
        self.buffers, self.s0, self.n, self.length = buffers, s0, n, length
        self.cols_NQ = cols_NQ
        self.rows_NQ = torch.arange(n, device=cols_NQ.device)[:, None].expand_as(cols_NQ)
        super().__init__(layers=[_SlotLayer(self, i) for i in range(buffers.num_layers)])
