"""Attention without cuDNN's backend, for the passes whose shapes change from call to call.

On Hopper, torch's scaled-dot-product attention prefers cuDNN's kernel for masked attention. cuDNN
builds an execution graph for every new shape (rows, heads, query and key lengths) and keeps it by
shape; a build costs hundreds of milliseconds of host time. The engine's prefill passes (their rows
and prompt lengths), its decode-graph captures (one per batch and length bucket) and the trainer's
micro-batches (rows and padded lengths) meet a new shape almost every call, so each paid a build.
The flash and memory-efficient kernels have no per-shape setup, so these passes run with cuDNN's
attention switched off (`varying_shape_attention`).

torch keeps the backend switches process-wide, not per thread, so entries are counted: the first
switches cuDNN's attention off, the last restores what was set before. Attention another thread of
the process runs meanwhile picks among the other kernels too (the same function, other rounding).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch

__all__ = ["varying_shape_attention"]

_lock = threading.Lock()
_depth = 0
_was_enabled = True


@contextlib.contextmanager
def varying_shape_attention() -> Iterator[None]:
    """Inside: SDPA never picks cuDNN's kernel (module doc); the switch is CUDA's only, so off CUDA
    no kernel changes."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = torch.backends.cuda.cudnn_sdp_enabled()
            torch.backends.cuda.enable_cudnn_sdp(False)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                torch.backends.cuda.enable_cudnn_sdp(_was_enabled)
