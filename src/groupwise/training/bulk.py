"""Checks and copies of an adapter's many small tensors in a few device operations.

A LoRA adapter on every projection of a 24-layer model is 336 tensors, and its AdamW moments twice as
many again. One by one, each check or clone is a kernel launch or two: on a GPU, tens of milliseconds
of a step's Python for a few megabytes, paid at every step by every run on a shared base
(docs/benchmarks.md, several runs on one GPU). Here a check is two multi-tensor kernels and one sync,
and a clone one multi-tensor copy. A checkpoint's copies to the CPU stay one per tensor: on an H200
three ways of batching them measured slower or no better (one flat transfer: its 100 MB pageable
buffer and the copies out of it; pinned copies without waiting: a pinned allocation for each tensor at
every step, while the last snapshots still hold theirs; a pinned staging buffer kept by the process, one
wait, then copies out of it: 24.5 -> 31.3 ms for a 0.5B checkpoint's 1,008 tensors, 67.5 -> 56.5 ms at 7B).
"""

from __future__ import annotations

import torch

__all__ = ["clones", "finite_flags"]


def clones(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each tensor (same device, dtype, shape and bits), for an undo."""
    if not tensors:
        return []
    out = [torch.empty_like(t) for t in tensors]
    torch._foreach_copy_(out, [t.detach() for t in tensors])
    return out


def finite_flags(tensors: list[torch.Tensor]) -> list[bool]:
    """Whether each tensor holds only finite values (an integer tensor always does), with one device sync
    per device and dtype: one for an adapter."""
    flags = [True] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        if (t.is_floating_point() or t.is_complex()) and t.numel():
            groups.setdefault((t.device, t.dtype), []).append(i)
    if not groups:
        return flags
    # x * 0 is 0 where x is finite and nan where it is inf or nan, and a norm (a sum) keeps a nan: a
    # tensor's norm of its zeros is finite exactly when all of it is
    checks = [torch.stack(torch._foreach_norm(torch._foreach_mul([tensors[i].detach() for i in idx], 0.0)))
              for idx in groups.values()]
    ok = [good for c in checks for good in torch.isfinite(c).tolist()]  # a sync per device and dtype
    for i, good in zip([i for idx in groups.values() for i in idx], ok):
        flags[i] = bool(good)
    return flags
