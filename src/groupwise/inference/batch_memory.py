"""Memory admission of the engine's batches: price what admitting a request makes the engine hold before
it is admitted; hold it back while the rows running beside it make it not fit, and refuse one that can
never fit with what to change, instead of an out-of-memory error in a prefill or a decode step (which
fails every request in flight, or on a CUDA card that cannot free, hangs the server).

What a request costs (bytes; a the model dtype's size, h hidden, i intermediate, q and kv the attention's
query and key/value widths, V the vocabulary):

- the slot cache (kv_cache.py) grown to its longest sequence: every slot gets the columns of the longest
  prompt + max_tokens among the rows running and admitted, so the price of a long request is its length
  times `max_batch_size` slots, not its own row; while the buffers grow, the old ones live beside the
  new until copied (`SlotBuffers.growth_to` says to what size decoding will grow them);
- the prefix cache's store (prefix_cache.py), allocated at the first prefill;
- one forward pass at a time on top of the cache, the larger of the prefill's and a decode step's: per
  query token, one layer's working set alive (the residual, the norm's fp32 copy and result, q, k, v,
  the attention output and the MLP's gate, up, silu and product: (2h + 2q + 2kv + 4i) a + 8h), the
  boolean mask (rows x queries x columns bytes; SDPA's fused kernels, the CPU's flash one too, hold no
  [rows, heads, queries, columns] scores), in the prefill K and V repeated up to the query heads
  (rows x columns x 2q a: transformers' masked SDPA), and the last position's logits with their fp32
  log-softmax (rows x V x (a + 8)). On the CPU's kernels this is never under the live tensors of a
  prefill pass of hundreds to thousands of tokens and at most twice them (1.4-1.6 times on a wider tiny
  model; tests/inference/test_batch_memory.py): an upper bound, as admission wants. The prefill runs its padded prompts in chunks of
  `max_prefill_tokens // rows` queries (prefill.run_rows), so a chunk is what one pass holds.

The engine may use `memory_limit_bytes` (an `Engine` setting: a fixed budget for the cache and the
passes, the weights not included), or by default what the device has free beside what the engine
holds already. The KV cache is the engine's to grow; the trainer's update prices its own peak
(training/step_memory.py) while the engine is paused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from groupwise.inference.kv_cache import SlotBuffers
from groupwise.inference.requests import RequestMemoryError
from groupwise.runtime.memory import allocatable_bytes

__all__ = ["BatchMemory", "BatchPrice", "RequestMemoryError"]

GB = 2**30


@dataclass(frozen=True)
class BatchPrice:
    """What the engine holds at its fullest while a set of rows runs, by part (bytes)."""

    kv: int  # the slot cache at the capacity the longest row needs
    growth: int  # the old buffers beside the new while they grow (0: no growth)
    store: int  # the prefix cache's store
    prefill: int  # the prefill pass's activations, mask, scores and logits
    decode: int  # a decode step's, over every slot
    capacity: int  # columns per slot
    slots: int

    @property
    def total(self) -> int:
        return self.kv + self.store + max(self.growth, self.prefill, self.decode)

    def describe(self) -> str:
        return (f"{self.total / GB:.3f} GB (KV cache {self.kv / GB:.3f}: {self.slots} slots x {self.capacity} "
                f"tokens; the prefill pass {self.prefill / GB:.3f}; growing the cache {self.growth / GB:.3f}; "
                f"the prefix cache {self.store / GB:.3f})")


class BatchMemory:
    """Prices the engine's batches (module doc) against its limit or the device's free memory."""

    def __init__(self, text_config: Any, *, dtype: torch.dtype, device: torch.device, max_prefill_tokens: int,
                 limit: int | None):
        c = text_config
        heads = int(c.num_attention_heads)
        hidden = int(c.hidden_size)
        head_dim = int(getattr(c, "head_dim", None) or hidden // heads)
        self.hidden, self.heads = hidden, heads
        self.q_dim = heads * head_dim
        self.kv_dim = int(getattr(c, "num_key_value_heads", None) or heads) * head_dim
        self.intermediate = int(getattr(c, "intermediate_size", None) or 4 * hidden)
        self.vocab = int(c.vocab_size)
        self.act_bytes = torch.empty((), dtype=dtype).element_size()
        self.device = device
        self.max_prefill_tokens = max_prefill_tokens
        self.limit = limit

    def pass_bytes(self, rows: int, queries: int, columns: int, *, repeat_kv: bool) -> int:
        """One forward pass of `rows` rows of `queries` query tokens over `columns` columns (module doc);
        `repeat_kv`: the attention copies K and V up to the query heads (transformers' masked SDPA does in
        the prefill; the engine's decode attention reads them in place, attention.py)."""
        a = self.act_bytes
        tokens = rows * queries
        layer = tokens * ((2 * self.hidden + 2 * self.q_dim + 2 * self.kv_dim + 4 * self.intermediate) * a
                          + 8 * self.hidden)
        mask = rows * queries * columns
        copies = rows * columns * 2 * self.q_dim * a if repeat_kv and self.kv_dim < self.q_dim else 0
        logits = rows * self.vocab * (a + 8)
        return layer + mask + copies + logits

    def price(self, buffers: SlotBuffers, store: int, running: list[int], prompts: list[int],
              lengths: list[int]) -> BatchPrice:
        """The engine's fullest moment while rows run that will reach `running` tokens (prompt +
        max_tokens of each row in the slots) and requests are prefilled with prompts of `prompts` tokens
        that will reach `lengths`."""
        longest = max(running + lengths, default=0)
        capacity, before = buffers.growth_to(longest + 1)  # decode feeds the last token at column `longest`
        column = buffers.column_bytes()
        prefill = 0
        if prompts:
            rows = len(prompts)
            width = max(prompts)
            chunk = min(width, max(32, self.max_prefill_tokens // rows))
            prefill = self.pass_bytes(rows, chunk, width, repeat_kv=True)
        decode = self.pass_bytes(buffers.slots, 1, capacity, repeat_kv=False)
        growth = before * column if capacity > buffers.capacity else 0
        return BatchPrice(kv=capacity * column, growth=growth, store=store, prefill=prefill, decode=decode,
                          capacity=capacity, slots=buffers.slots)

    def room(self, held: int) -> int:
        """Bytes the engine may hold in all: its limit, or the device's free memory beside the `held`
        bytes it holds already."""
        if self.limit is not None:
            return self.limit
        free = allocatable_bytes(self.device)
        return held + free if free is not None else 1 << 62

    def refusal(self, price: BatchPrice, room: int, *, prompt: int, max_new: int) -> RequestMemoryError:
        where = (f"memory_limit_bytes={self.limit}" if self.limit is not None
                 else f"what {self.device} has free beside the engine's cache")
        return RequestMemoryError(
            f"this request needs about {price.describe()} of the engine's memory even alone, and the engine may use "
            f"{room / GB:.3f} GB ({where}): its prompt of {prompt} tokens + max_tokens {max_new} make every one of "
            f"the {price.slots} slots {price.capacity} tokens long. Running it would run out of memory. Lower "
            "max_tokens or shorten the prompt; or serve a shorter context (max_seq_len) or fewer slots "
            "(max_batch_size), or give the engine more memory.")
