"""Give the memory a training step freed back to the operating system (CPU, glibc).

Measured here: `groupwise train 2048` on SmolLM2 (CPU) grew by several GB a step and was killed by the
OOM killer at ~24 GB resident around step 5, though one step needs ~7 GB. The step's activations are
tensors of a few MB each; glibc serves those from per-thread heaps ("arenas") and keeps what is freed,
and the step runs in a worker thread while the engine decodes in another, so the freed memory piles up
in several arenas. `malloc_trim(0)` returns free pages of every arena to the OS.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["release_freed_memory"]

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
