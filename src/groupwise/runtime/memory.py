"""Give freed memory back to the operating system (Linux, glibc); keep what is loaded out of the garbage collector's sight; and how much is free (a KV cache, admission).

glibc keeps what a process frees in its heap instead of returning it to the OS (after large frees it
also raises its mmap threshold, so later allocations come from the heap too). Two places pay for it:
a CPU training step allocates gigabytes of activations as tensors of a few MB each, and resident memory
grew step after step until the OOM killer ended the run; and a server that parsed a multi-MB request
body kept its peak for good. `malloc_trim(0)` returns the free pages of every arena; the worker calls
it after each step, the server after a large request (inference/memory_release.py).

Python's full collections walk every tracked object, and a process holding a model has hundreds of
thousands (torch, transformers, the modules): each one a pause of every thread, the engine's included,
set off by the rollouts' short-lived objects. `freeze_loaded` moves what is loaded into the collector's
permanent generation (as vLLM does after loading); `thaw_loaded` gives it back before a model is dropped.
What is made to last after the load is walked again by every full collection: torch.compile's graphs,
guards and kernels (a compiled update or decode pass leaves hundreds of thousands of objects), modules
imported on first use. A full collection slower than `SLOW_FULL_COLLECTION_S` says so, and
`refreeze_wanted` tells the process to freeze again where it is safe to (with compiled updates, a
worker's full collections grew from under 1 ms to 0.2 s within a few steps on the 2-core CPU, each one
stopping the update, the engine and the server's threads together).
"""

from __future__ import annotations

import ctypes
import gc
import sys
import time
from typing import Any

__all__ = ["PRESSED_FRACTION", "REFREEZE_OBJECTS", "SLOW_FULL_COLLECTION_S", "allocatable_bytes", "free_memory_bytes",
           "freeze_loaded", "memory_pressed", "refreeze_wanted", "release_freed_memory", "thaw_loaded"]

# A full collection walks every tracked object that is not frozen. Once the load is frozen, that is what
# the process holds for the work in hand (a step's requests and batches: a few milliseconds to walk);
# longer means objects made to last since, walked again by every later full collection (module doc).
SLOW_FULL_COLLECTION_S = 0.010
# Objects lasting unfrozen that make freezing again worth it: a sixth of what a driver process loads (~300,000,
# whose walk took 0.15 s a full collection on the 2-core CPU).
REFREEZE_OBJECTS = 50_000

_libc = None


def release_freed_memory() -> bool:
    """Ask glibc to return freed heap memory to the OS. False where that does not apply (not glibc)."""
    global _libc
    if not sys.platform.startswith("linux"):
        return False
    try:
        if _libc is None:
            _libc = ctypes.CDLL("libc.so.6")
        return bool(_libc.malloc_trim(0))
    except (OSError, AttributeError):  # musl or another libc: nothing to trim this way
        return False


def freeze_loaded() -> None:
    """Take everything loaded so far (torch, transformers, a model's modules and adapters: hundreds of
    thousands of objects even for a tiny model) out of the garbage collector's sight, after collecting
    what is already garbage. Rollouts allocate many short-lived objects, which set off full collections
    that walk every tracked object: 0.3 s pauses of every thread (the engine's too) with a tiny model on
    the 2-core CPU; frozen, the longest pause was 0.016 s (bench/request_overhead.py). A process that holds a model calls this
    after loading it, from the thread that captures CUDA graphs: a collection must not run in a capture
    (inference/decode_graphs.py). Called again when `refreeze_wanted`."""
    global _slow_full_collection
    _watch_full_collections()
    gc.collect()
    gc.freeze()
    _slow_full_collection = False  # the collection just above may have been slow: it is what freezing fixed


def refreeze_wanted() -> bool:
    """Freeze again (from a thread where `freeze_loaded` may run)? Yes when a full collection since the last
    `freeze_loaded` was slow while something is frozen (a model is loaded) and at least `REFREEZE_OBJECTS`
    objects have lasted since, unfrozen. Asked between steps, when a step's own objects are gone: a slow
    collection that walked the requests in flight (a GPU worker's took 17-23 ms in steps of 256 rollouts once
    its compiled graphs were frozen) is no reason, and freezing what a step leaves would keep its cycles out
    of the collector's reach for good."""
    global _slow_full_collection
    if not _slow_full_collection or gc.get_freeze_count() == 0:
        return False
    if len(gc.get_objects(generation=2)) >= REFREEZE_OBJECTS:
        return True
    _slow_full_collection = False  # it walked the work in hand: ask again at the next slow one
    return False


_slow_full_collection = False
_full_collection_started: float | None = None


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    """gc callback: notes a full collection slower than SLOW_FULL_COLLECTION_S (collections run one at a
    time, under the GIL)."""
    global _full_collection_started, _slow_full_collection
    if info.get("generation") != 2:
        return
    if phase == "start":
        _full_collection_started = time.perf_counter()
    elif _full_collection_started is not None:
        if time.perf_counter() - _full_collection_started > SLOW_FULL_COLLECTION_S:
            _slow_full_collection = True
        _full_collection_started = None


def _watch_full_collections() -> None:
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def thaw_loaded() -> None:
    """Give frozen objects back to the collector before a model is dropped: a cycle among its objects
    would otherwise never be freed (its tensors included) while the process lives."""
    gc.unfreeze()


def free_memory_bytes(device: Any) -> int:
    """Memory free for the KV cache: the GPU's free memory, or the host's MemAvailable (Linux)."""
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return 8 * 2**30  # not Linux: assume a modest machine


def allocatable_bytes(device: Any) -> int | None:
    """Bytes this process can still allocate on `device`: on CUDA the card's free memory plus what torch's
    allocator has cached but not in use; on the CPU the machine's available RAM (MemAvailable). None where
    it cannot be read. What memory admission compares a priced peak with (training/step_memory.py,
    inference/batch_memory.py)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free) + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as f:
                return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        except (OSError, StopIteration, ValueError, IndexError):
            return None
    return None


PRESSED_FRACTION = 0.25  # a device with less than this share of its memory allocatable is under pressure


def memory_pressed(device: Any) -> bool:
    """Whether CUDA `device` has less than `PRESSED_FRACTION` of its memory still allocatable (free, or cached
    by torch and unused): where a trainer's update may need what the engine's idle caches hold (the engine
    frees them then: inference/engine.py). False off CUDA and where the memory cannot be read."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return False
    allocatable = allocatable_bytes(device)
    total = torch.cuda.get_device_properties(device).total_memory
    return allocatable is not None and allocatable < PRESSED_FRACTION * total
