"""A prefix cache: the KV of prompt prefixes seen before, so a prefill runs only the new suffix.

Why. Rollouts repeat themselves: every request carries the chat template's system prompt, the N
rollouts of a GRPO group share their scenario prompt, and turn t+1 of a conversation starts with
turn t's prompt. The key/value of token i depends only on tokens 0..i (and the adapter), so the
KV columns a previous prefill computed for the same tokens can be copied instead of recomputed.
(vLLM's automatic prefix caching and SGLang's radix cache are the same idea over paged memory.)

Layout. A pool of blocks of `block_size` token columns, one tensor pair per layer::

    keys[layer], values[layer]   # [NB, H_kv, block_size, D]

and a trie over them: a block's key is (parent block, its tokens), the root's parent is the adapter,
so adapters never share entries. Full blocks have children; the last block of a stored prompt may be
partial (fewer than block_size tokens, never a parent) and is widened in place when a longer prompt
comes. A lookup walks full blocks, then takes the longest common prefix with one child, so a hit has
token granularity. Hits are COPIED into the slot cache (kv_cache.py), whose buffers therefore never
move or alias the pool (the CUDA-graph contract of decode_graphs.py holds). Eviction is least
recently used; a match touches the deepest block first and the root last, so leaves go first, and
evicting a block evicts what hangs below it.

Validity. Entries are right only while the weights that made them are: the engine clears the cache
when a pause ends (the trainer may have changed an adapter in place) and when an adapter is added
or removed. It also clears it whenever it goes idle, so a request only reuses KV of requests it
overlapped (advance.py `retire` says why: bit-identical resumes). Copied KV equals a cold prefill's
up to float rounding of a different batch shape (tests/inference/test_prefix_cache.py: 1e-4 fp32).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from groupwise.errors import ConfigError
from groupwise.inference.kv_cache import SlotBuffers

__all__ = ["Hit", "PrefixCache"]


@dataclass
class _Block:
    serial: int  # unique forever (pool indices are reused; a stale child must not find a new parent)
    parent: Any  # the parent's serial, or ("root", adapter)
    tokens: tuple[int, ...]
    index: int  # row of the pool
    children: dict[tuple[int, ...], int] = field(default_factory=dict)


@dataclass
class Hit:
    """A lookup's result: `length` prompt tokens found, as (pool index, columns) segments in order."""

    length: int = 0
    segments: list[tuple[int, int]] = field(default_factory=list)


def common_prefix(a, b) -> int:
    """Length of the common prefix of two token sequences."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]; bisect (slices compare in C)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """The block pool and its trie (module doc). Memory: `tokens` x layers x 2 x H_kv x D x dtype size."""

    def __init__(self, buffers: SlotBuffers, tokens: int, block_size: int = 16):
        if block_size < 1 or tokens < block_size:
            raise ConfigError(f"prefix cache of {tokens} tokens in blocks of {block_size}: pass tokens >= "
                              f"block_size >= 1 (or prefix_cache_tokens=0 to turn it off)",
                              what="prefix cache settings")
        self.buffers, self.block_size = buffers, block_size
        self.num_blocks = tokens // block_size
        self.keys: list[torch.Tensor] = []  # allocated at the first insert
        self.values: list[torch.Tensor] = []
        self.clear()

    def clear(self) -> None:
        """Forget every entry (the pool's memory stays allocated)."""
        self._blocks: dict[int, _Block] = {}
        self._roots: dict[Any, dict[tuple[int, ...], int]] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._serial = 0

    def release(self) -> None:
        """Forget every entry and free the pool; the next insert allocates it again."""
        self.clear()
        self.keys, self.values = [], []

    def __len__(self) -> int:
        return len(self._blocks)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    # ------------------------------------------------------------------ lookup
    def _children(self, parent: Any) -> dict[tuple[int, ...], int]:
        return self._blocks[parent].children if isinstance(parent, int) else self._roots.get(parent, {})

    def match(self, adapter: str, tokens: list[int], limit: int) -> Hit:
        """The longest cached prefix of tokens[:limit] for this adapter."""
        hit, bs = Hit(), self.block_size
        parent: Any = ("root", adapter)
        path: list[int] = []
        while hit.length < limit:
            want = tuple(tokens[hit.length : min(hit.length + bs, limit)])
            kids = self._children(parent)
            serial = kids.get(want) if len(want) == bs else None
            if serial is not None:  # a full block: go deeper
                hit.segments.append((self._blocks[serial].index, bs))
                hit.length += bs
                path.append(serial)
                parent = serial
                continue
            best, best_n = None, 0  # the last, partial step: the child sharing most tokens
            for kid_tokens, kid in kids.items():
                n = common_prefix(kid_tokens, want)
                if n > best_n:
                    best, best_n = kid, n
            if best is not None:
                hit.segments.append((self._blocks[best].index, best_n))
                hit.length += best_n
                path.append(best)
            break
        for serial in reversed(path):  # deepest first: the root ends most recent (module doc)
            self._lru.move_to_end(serial)
        return hit

    def copy_into(self, rows: list[tuple[int, Hit]]) -> None:
        """Write each hit into columns [0, hit.length) of its slot: rows = [(slot, hit)]."""
        slot_T, col_T, block_T, bcol_T = self._index(rows)
        if not slot_T:
            return
        dev = self.buffers.device
        slot_T, col_T, block_T, bcol_T = (torch.tensor(x, device=dev) for x in (slot_T, col_T, block_T, bcol_T))
        for buf, pool in zip(self.buffers.keys + self.buffers.values, self.keys + self.values):
            buf[slot_T, :, col_T] = pool[block_T, :, bcol_T]  # [T, H, D] both sides

    def _index(self, rows: list[tuple[int, Hit]], first_cols: list[int] | None = None):
        """Flat per-token indices (slot, column, pool index, pool column) of hits laid out from column
        first_cols[i] (default 0) of their slot, one block_size stride per segment."""
        slot_T: list[int] = []
        col_T: list[int] = []
        block_T: list[int] = []
        bcol_T: list[int] = []
        for i, (slot, hit) in enumerate(rows):
            col = first_cols[i] if first_cols else 0
            for index, n in hit.segments:
                slot_T += [slot] * n
                col_T += range(col, col + n)
                block_T += [index] * n
                bcol_T += range(n)
                col += self.block_size
        return slot_T, col_T, block_T, bcol_T

    # ------------------------------------------------------------------ insertion and eviction
    def insert(self, entries: list[tuple[str, list[int], int]]) -> int:
        """Store the KV of each prompt from its slot: entries = [(adapter, tokens, slot)], the slot
        holding those tokens' KV at columns [0, len(tokens)). Returns how many blocks were written."""
        if not self.keys:
            b = self.buffers
            shape = (self.num_blocks, b.kv_heads, self.block_size, b.head_dim)
            self.keys = [torch.zeros(shape, dtype=b.dtype, device=b.device) for _ in range(b.num_layers)]
            self.values = [torch.zeros(shape, dtype=b.dtype, device=b.device) for _ in range(b.num_layers)]
        copies: list[tuple[int, int, int, int]] = []  # (slot, first column, pool index, columns)
        bs = self.block_size
        for adapter, tokens, slot in entries:
            parent: Any = ("root", adapter)
            pinned: set[int] = set()  # this prompt's blocks so far: not evicted while it is stored
            path: list[int] = []
            for start in range(0, len(tokens), bs):
                want = tuple(tokens[start : start + bs])
                kids = self._children(parent) if isinstance(parent, int) else self._roots.setdefault(parent, {})
                serial = kids.get(want)
                if serial is None and (serial := self._widen_partial(kids, want)) is not None:
                    self._rekey(serial, want)  # a partial block grows: rewrite its columns
                    index = self._blocks[serial].index
                    copies = [c for c in copies if c[2] != index] + [(slot, start, index, len(want))]
                if serial is None:
                    index = self._allocate(pinned)
                    if index is None:
                        break  # every block is this prompt's: the pool is too small for it
                    copies = [c for c in copies if c[2] != index]  # an evicted block's pending write
                    self._serial += 1
                    serial = self._serial
                    self._blocks[serial] = _Block(serial, parent, want, index)
                    kids[want] = serial
                    copies.append((slot, start, index, len(want)))
                pinned.add(serial)
                path.append(serial)
                self._lru[serial] = None
                if len(want) < bs:
                    break
                parent = serial
            for serial in reversed(path):  # deepest first: the root ends most recent
                self._lru.move_to_end(serial)
        if copies:
            rows = [(slot, Hit(n, [(index, n)]), start) for slot, start, index, n in copies]
            slot_T, col_T, block_T, bcol_T = self._index([(slot, hit) for slot, hit, _ in rows],
                                                         [start for _, _, start in rows])
            dev = self.buffers.device
            slot_T, col_T, block_T, bcol_T = (torch.tensor(x, device=dev) for x in (slot_T, col_T, block_T, bcol_T))
            for buf, pool in zip(self.buffers.keys + self.buffers.values, self.keys + self.values):
                pool[block_T, :, bcol_T] = buf[slot_T, :, col_T]
        return len(copies)

    def _widen_partial(self, kids: dict[tuple[int, ...], int], want: tuple[int, ...]) -> int | None:
        """A stored partial block that `want` extends (same first tokens, more of them): reuse it."""
        for kid_tokens, kid in kids.items():
            if len(kid_tokens) < len(want) and want[: len(kid_tokens)] == kid_tokens:
                return kid
        return None

    def _rekey(self, serial: int, tokens: tuple[int, ...]) -> None:
        block = self._blocks[serial]
        kids = self._children(block.parent)
        del kids[block.tokens]
        block.tokens = tokens
        kids[tokens] = serial

    def _allocate(self, pinned: set[int]) -> int | None:
        while not self._free:
            victim = next((s for s in self._lru if s not in pinned), None)
            if victim is None:
                return None
            self._evict(victim)
        return self._free.pop()

    def _evict(self, serial: int) -> None:
        block = self._blocks.pop(serial)
        self._lru.pop(serial, None)
        self._free.append(block.index)
        for child in list(block.children.values()):
            self._evict(child)
        if isinstance(block.parent, int):
            parent = self._blocks.get(block.parent)  # None while a subtree goes
            kids = parent.children if parent is not None else {}
        else:
            kids = self._roots.get(block.parent, {})
        if kids.get(block.tokens) == serial:
            del kids[block.tokens]
