"""Checks and copies of an adapter's many small tensors in a few device operations.

A LoRA adapter on every projection of a 24-layer model is 336 tensors, and its AdamW moments twice as
many again. One by one, each check or clone is a kernel launch or two: on a GPU, tens of milliseconds
of a step's Python for a few megabytes, paid at every step by every run on a shared base
(docs/benchmarks.md, several runs on one GPU). Here a check is two multi-tensor kernels and one sync,
and a clone one multi-tensor copy.

A checkpoint's copies to the CPU (`host_copies`) go through one page-locked staging buffer that lives as
long as the process: every tensor is copied into its place there without waiting, the device is waited
for once, and the CPU copies out of it. One by one into pageable memory, each of the ~1000 copies waits
for the device and is staged by the driver (88-117 ms a step at 0.5B on an H200); two earlier ways of
batching them measured slower there: one flat transfer into a fresh 100 MB pageable buffer, and a fresh
pinned allocation per tensor at every step (page-locking memory is what costs).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["clones", "finite_flags", "host_copies"]


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


_ALIGN = 64  # bytes: every tensor's place in the staging buffer, so it can be viewed as any dtype
_staging: dict[torch.device, torch.Tensor] = {}  # per CUDA device: page-locked uint8, grown as needed
_staging_lock = threading.Lock()  # the buffer is reused: one batch of copies at a time


def host_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A CPU copy of each tensor: contiguous, its own storage, the same dtype, shape and bits (what
    ``t.detach().to("cpu", copy=True).contiguous()`` gives), safe to keep and to write while training
    goes on. A CUDA device's tensors go through its staging buffer with one wait (module doc)."""
    out: list[torch.Tensor | None] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.device.type == "cuda" and t.numel():
            by_device.setdefault(t.device, []).append(i)
        else:
            out[i] = t.detach().to("cpu", copy=True).contiguous()
    for device, idx in by_device.items():
        offsets, total = [], 0
        for i in idx:
            offsets.append(total)
            total += -(-tensors[i].numel() * tensors[i].element_size() // _ALIGN) * _ALIGN
        with _staging_lock:
            buf = _staging.get(device)
            if buf is None or buf.numel() < total:
                _staging.pop(device, None)  # the old one is freed before the larger one is pinned
                buf = _staging[device] = torch.empty(total, dtype=torch.uint8, pin_memory=True)
            staged = []
            with torch.cuda.device(device):
                for i, at in zip(idx, offsets):
                    t = tensors[i].detach()
                    view = buf[at:at + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
                    view.copy_(t, non_blocking=True)
                    staged.append(view)
                torch.cuda.current_stream(device).synchronize()
            copies = [torch.empty(v.shape, dtype=v.dtype) for v in staged]
            torch._foreach_copy_(copies, staged)  # out of the buffer before the next batch reuses it
        for i, c in zip(idx, copies):
            out[i] = c
    return out  # type: ignore[return-value]
