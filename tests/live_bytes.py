"""The bytes of tensors alive at once, counted by a dispatch mode (imported by name by the memory tests).

CUDA's allocator reports its high-water mark of allocated bytes (torch.cuda.max_memory_allocated); the
CPU has no such counter, only the process's resident memory, which also holds what the allocator freed
but kept. `LiveTensorBytes` counts what CUDA would: every storage an op creates inside the block, from
its creation until it is freed, so a CPU test can check the estimate's tensor count
(training/step_memory.py) exactly, on the CPU's kernels."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """``with LiveTensorBytes() as live: ...``; then `live.peak`: the most bytes of storages created in
    the block that were alive at one time. Views and in-place results share an input's storage and are
    not counted again; storages made before the block (the weights) are not counted at all."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if key in inputs or key in self._seen or nbytes == 0:
                continue
            self._seen.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, nbytes)
        return out
