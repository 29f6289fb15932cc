"""Give the memory a training step freed back to the operating system (CPU, glibc).

A CPU training step allocates gigabytes of activations as tensors of a few MB each. glibc keeps what
is freed in its heap (after large frees it also raises its mmap threshold, so later tensors come from
the heap too) instead of returning it to the OS, and resident memory grows step after step until the
OOM killer ends the run. `malloc_trim(0)` returns the free pages of every arena after each step.
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
