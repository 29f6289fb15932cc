"""Checks and copies of an adapter's many small tensors in a few device operations.

A LoRA adapter on every projection of a 24-layer model is 336 tensors, and its AdamW moments twice as
many again. One by one, each check or clone is a kernel launch or two: on a GPU, tens of milliseconds
of a step's Python for a few megabytes, paid at every step by every run on a shared base
(docs/benchmarks.md, several runs on one GPU). Here a check is two multi-tensor kernels and one sync,
and a clone one multi-tensor copy. The copies to the CPU for a checkpoint go into pinned memory without
waiting, with one wait for all of them: into pageable memory each waits for the device. (One flat
transfer, a concatenation on the device split on the CPU, measured slower on an H200: its 100 MB
pageable buffer and the copies out of it cost more than the waits it saved.)
"""

from __future__ import annotations

import torch

__all__ = ["clones", "cpu_copies", "finite_flags"]


def clones(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A copy of each tensor (same device, dtype, shape and bits), for an undo."""
    if not tensors:
        return []
    out = [torch.empty_like(t) for t in tensors]
    torch._foreach_copy_(out, [t.detach() for t in tensors])
    return out


def cpu_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A contiguous CPU tensor of its own for each tensor, with the same bits (none shares memory with
    another, which safetensors refuses, or with its source, which training goes on changing). A CUDA
    tensor's copy is pinned (PyTorch's caching host allocator: the memory comes back when the copy is
    dropped, once its checkpoint is written)."""
    out = []
    waits = set()
    for t in tensors:
        t = t.detach()
        if t.device.type == "cuda":
            copy = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            copy.copy_(t, non_blocking=True)
            waits.add(t.device)
        else:
            copy = t.to("cpu", copy=True).contiguous()
        out.append(copy)
    for device in waits:
        torch.cuda.current_stream(device).synchronize()
    return out


def finite_flags(tensors: list[torch.Tensor]) -> list[bool]:
    """Whether each tensor holds only finite values, with one device sync for all of them."""
    flags = [True] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        if t.is_floating_point() and t.numel():
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
