"""Checks and copies of an adapter's many small tensors in a few device operations.

A LoRA adapter on every projection of a 24-layer model is 336 tensors, and its AdamW moments twice as
many again. One by one, each check or clone is a kernel launch or two, and each Python-level op costs
5-30 us of a process whose GIL the engine, the trainer and the checkpoint writers share: on a GPU, tens
of milliseconds of a step for a few megabytes, paid at every step by every run on a shared base
(docs/benchmarks.md, several runs on one GPU). Here a check is two multi-tensor kernels and one sync, a
copy one concatenation per dtype (`flat_copies`), a comparison one flat comparison (`all_equal`), and a checkpoint's copies
to the CPU one transfer per device and dtype whose copies are views of one page-locked block
(`host_copies`: 8.4 -> 1.7 ms for a 0.5B adapter on an H200, 18.0 -> 4.3 ms for its AdamW state). The
ways of batching that transfer that lost (one pageable buffer, a staging buffer kept by the process)
each paid a copy or a slice per tensor on the CPU after it.
"""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["all_equal", "all_finite", "finite_flags", "flat_copies", "host_copies", "unflat_copies"]

SMALL_CPU_BYTES = 1 << 20  # CPU tensors of one dtype up to this size in all (AdamW's step counts) copy as one
DEVICE_CHUNK_BYTES = 64 << 20  # the most one flat buffer of `host_copies` or `all_equal` holds at once (`_chunks`)


def flat_copies(tensors: list[torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """A copy of `tensors` as one flat buffer per device and dtype: (the tensors' indices, the buffer). One
    allocation and one concatenation a group, where a copy per tensor allocates each one: on a GPU the
    allocations of an adapter and its AdamW moments (~1,000 tensors) were ~10 ms of the host's time at the
    end of every update, with the device idle. `unflat_copies` gives the tensors back."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    with torch.no_grad():  # torch's flatten returns a lone contiguous tensor itself, not a copy
        return [(idx, _flatten_dense_tensors([tensors[i] for i in idx]) if len(idx) > 1 else
                 tensors[idx[0]].detach().reshape(-1).clone()) for idx in groups.values()]


def unflat_copies(flat: list[tuple[list[int], torch.Tensor]], like: list[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors `flat_copies(like)` copied, each a view of its group's buffer with `like`'s shape."""
    out: list[torch.Tensor | None] = [None] * len(like)
    for idx, buffer in flat:
        for i, view in zip(idx, _unflatten_dense_tensors(buffer, [like[i] for i in idx])):
            out[i] = view
    return out  # type: ignore[return-value]


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """A 0-dim bool tensor, on the first tensor's device and not read back: whether every floating tensor
    holds only finite values. One concatenation and one reduction per device and dtype; where it says
    False, `finite_flags` says which."""
    floating = [t for t in tensors if (t.is_floating_point() or t.is_complex()) and t.numel()]
    if not floating:
        return torch.ones((), dtype=torch.bool, device=tensors[0].device if tensors else None)
    checks = [torch.isfinite(buffer).all() for _, buffer in flat_copies(floating)]
    device = floating[0].device
    return torch.stack([c.to(device) for c in checks]).all()


def all_equal(xs: list[torch.Tensor], ys: list[torch.Tensor]) -> bool:
    """Whether each xs[i], cast to ys[i]'s dtype and moved to its device, equals ys[i] (same shapes), with
    one flat comparison and one sync per group of dtypes and devices (per chunk of it: `_chunks`): no
    per-tensor launch."""
    groups: dict[tuple, list[int]] = {}
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        groups.setdefault((x.device, x.dtype, y.device, y.dtype), []).append(i)
    with torch.no_grad():
        for (_, _, device, dtype), idx in groups.items():
            for chunk in _chunks([xs[i] for i in idx]):
                x = _flatten_dense_tensors([xs[idx[k]] for k in chunk]).to(device=device, dtype=dtype)
                if not torch.equal(x, _flatten_dense_tensors([ys[idx[k]] for k in chunk])):
                    return False
    return True


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


def _chunks(tensors: list[torch.Tensor]) -> list[list[int]]:
    """The indices of `tensors`, in order, in runs of at most DEVICE_CHUNK_BYTES (a larger tensor alone): what
    one flat buffer of them may hold on the device at once. A 7B adapter's moments are ~0.3 GB, and the
    device may be full again (the engine's KV) when a run publishes and its served adapter is checked."""
    chunks: list[list[int]] = []
    size = 0
    for i, t in enumerate(tensors):
        n = t.numel() * t.element_size()
        if not chunks or size + n > DEVICE_CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += n
    return chunks


def _gather_into(block: torch.Tensor, tensors: list[torch.Tensor]) -> torch.Tensor:
    """Copy `tensors`, flattened and in order, into the CPU `block`, gathered on their device a chunk at a
    time (`_chunks`). Returns `block`; from a device the copies are queued (non-blocking), the caller waits."""
    offset = 0
    for chunk in _chunks(tensors):
        flat = _flatten_dense_tensors([tensors[i] for i in chunk])
        block[offset:offset + flat.numel()].copy_(flat, non_blocking=flat.device.type == "cuda")
        offset += flat.numel()
    return block


def host_copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A CPU copy of each tensor that nothing else shares or changes (same dtype, shape and bits), for a
    checkpoint written and served while training goes on. A CUDA device's tensors of one dtype cross in
    one transfer: gathered on the device (`_gather_into`), copied into one page-locked block (torch's
    caching host allocator keeps it for reuse once it is freed: about an adapter and its moments' size per
    run that checkpoints at once), one wait; the copies are views of that block, so it lives as long as
    any of them. The gather is one call per chunk and the views one call (torch's flat-buffer helpers of
    its data-parallel code): a Python-level op per tensor costs 5-30 us, and an adapter and its moments
    are ~1,000 tensors."""
    out: list[torch.Tensor | None] = [None] * len(tensors)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    blocks = []
    with torch.no_grad():
        for (device, dtype), idx in groups.items():
            numel = sum(tensors[i].numel() for i in idx)
            if device.type == "cuda":
                try:
                    block = torch.empty(numel, dtype=dtype, pin_memory=True)
                except RuntimeError:  # no page-locked memory to be had: a pageable block (the copies then wait)
                    block = torch.empty(numel, dtype=dtype)
                blocks.append((_gather_into(block, [tensors[i] for i in idx]), idx))
            elif numel * tensors[idx[0]].element_size() <= SMALL_CPU_BYTES:
                blocks.append((_gather_into(torch.empty(numel, dtype=dtype), [tensors[i] for i in idx]), idx))
            else:  # one by one: a large fresh buffer's first touch costs more than the small copies
                for i in idx:
                    out[i] = tensors[i].detach().to("cpu", copy=True).contiguous()
        for device in {device for device, _ in groups if device.type == "cuda"}:
            torch.cuda.current_stream(device).synchronize()
        for block, idx in blocks:
            for i, view in zip(idx, _unflatten_dense_tensors(block, [tensors[i] for i in idx])):
                out[i] = view
    return out  # type: ignore[return-value]
