"""Write a safetensors file without holding the GIL while its bytes go to disk.

A checkpoint is written on a thread of the worker process while that process goes on training other runs
and stepping the engine (backend/worker.py). safetensors' `save_file` holds the GIL through the whole
serialisation, and a 0.5B update is bound by launching kernels from Python: every millisecond the writer
holds the GIL is one the update waits (bench/checkpoint_write.py measures the pace a thread of small torch
ops keeps beside each writer; docs/benchmarks.md). Here the header is built in Python from getters, and the
bytes cross in a few large `write` calls (`_buffers` says why few), each of which lets go of the GIL while
the kernel copies them.

The file is safetensors' format exactly (its specification: an 8-byte little-endian header length, the
JSON header padded with spaces to a multiple of 8, then the tensors' bytes with no gap): the library
reads it back (`safetensors.torch.load_file`, peft's adapter loading), and the tests compare what it
reads with what `save_file` writes. The tensors go larger element sizes first, so each one starts at a
multiple of its element size, as in the library's files.

The file's fingerprint (its size and SHA-256, which a checkpoint's state.json records and a resume
checks) is computed from the buffers as they are written, where reading the file back to hash it would
copy every byte once more and take the GIL back once a read; `file_fingerprint` reads a file back,
for the files written otherwise and for the check at resume.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["file_fingerprint", "save_tensors"]


@functools.cache
def _dtype_names() -> "dict[torch.dtype, str]":
    """The format's name of each dtype it stores."""
    import torch

    return {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
            torch.bool: "BOOL", torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
            torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


READ_BYTES = 16 << 20  # what `file_fingerprint` reads at a time: each read takes the GIL back once


def file_fingerprint(path: str | Path) -> dict[str, object]:
    """``{"bytes": size, "sha256": hex digest}`` of a file on disk, read back into one reused buffer."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        buffer = memoryview(bytearray(min(READ_BYTES, max(1, os.fstat(f.fileno()).st_size))))
        while n := f.readinto(buffer):
            digest.update(buffer[:n])
            size += n
    return {"bytes": size, "sha256": digest.hexdigest()}


def save_tensors(tensors: "dict[str, torch.Tensor]", path: str | Path, metadata: dict[str, str] | None = None,
                 *, fingerprint: bool = True) -> dict[str, object] | None:
    """`safetensors.torch.save_file(tensors, path, metadata)`, with the GIL let go while the bytes are
    written (module doc); returns the file's `file_fingerprint`, hashed from what was written (None when
    not asked for: the hash is CPU work that only a file read back later needs). CPU tensors only (a
    checkpoint's snapshot is CPU copies); a tensor that is not contiguous, a dtype the format lacks, or a
    big-endian host goes to the library's writer instead (and the file is read back to hash)."""
    names = _dtype_names()
    if sys.byteorder != "little" or any(
            t.device.type != "cpu" or not t.is_contiguous() or t.dtype not in names for t in tensors.values()):
        from safetensors.torch import save_file

        save_file(tensors, str(path), metadata=metadata)
        return file_fingerprint(path) if fingerprint else None
    # by dtype, in memory order: a snapshot's tensors are views of one block per dtype (training/bulk.py),
    # so they follow each other and each block crosses in one `write` (`_buffers`)
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), str(tensors[name].dtype),
                                             tensors[name].data_ptr(), name))
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in order:
        t = tensors[name]
        n = t.numel() * t.element_size()
        header[name] = {"dtype": names[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    head = struct.pack("<Q", len(text)) + text
    digest = hashlib.sha256(head) if fingerprint else None  # lets go of the GIL on a large buffer, as `write`
    with open(path, "wb") as f:
        f.write(head)
        for buffer in _buffers([tensors[name] for name in order]):
            if digest is not None:
                digest.update(buffer)
            f.write(buffer)
    return None if digest is None else {"bytes": len(head) + offset, "sha256": digest.hexdigest()}


CHUNK_BYTES = 64 << 20  # tensors apart in memory are joined into buffers of at most this size


def _buffers(tensors: "list[torch.Tensor]") -> "Iterator[memoryview]":
    """The tensors' bytes, in order, as a few large buffers, one at a time (a joined one is freed once
    written, so a large scattered checkpoint never has a second copy of itself in memory).

    Few torch calls matter more than few copies. A torch op lets go of the GIL and takes it back, and taking
    it back from a thread that runs Python waits up to the interpreter's switch interval (5 ms): measured
    beside a spinning thread, a `view` cost 23 ms and a `detach` 6, where a getter (`data_ptr`, `numel`)
    cost a microsecond, and a first version that wrote tensor by tensor took 18-42 s a checkpoint. So the
    tensors are grouped with getters only, and then cross in a few calls: tensors that follow each other in
    one storage (a snapshot's views of one block, training/bulk.py) as one byte view of it, the others
    joined by dtype in one flatten each (a copy, without the GIL), up to CHUNK_BYTES."""
    import torch
    from torch._utils import _flatten_dense_tensors

    runs: list[list[torch.Tensor]] = []  # tensors adjacent in one storage, of one dtype
    for t in tensors:
        if not t.numel():
            continue
        last = runs[-1][-1] if runs else None
        if (last is not None and last.dtype == t.dtype
                and last.data_ptr() + last.numel() * last.element_size() == t.data_ptr()
                and last.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()):
            runs[-1].append(t)
        else:
            runs.append([t])
    pending: list[torch.Tensor] = []  # single tensors of one dtype, to join
    pending_bytes = 0
    with torch.no_grad():
        for run in [*runs, None]:
            nbytes = 0 if run is None else sum(t.numel() for t in run) * run[0].element_size()
            block = run is not None and (len(run) > 1 or nbytes >= CHUNK_BYTES // 64)  # crosses as it is
            if pending and (run is None or block or pending[0].dtype != run[0].dtype
                            or pending_bytes + nbytes > CHUNK_BYTES):
                flat = pending[0].reshape(-1) if len(pending) == 1 else _flatten_dense_tensors(pending)
                yield memoryview(flat.view(torch.uint8).numpy())
                pending, pending_bytes = [], 0
            if run is None:
                break
            if block:
                first = run[0]
                view = torch.empty(0, dtype=torch.uint8).set_(
                    first.untyped_storage(), first.storage_offset() * first.element_size(), (nbytes,))
                yield memoryview(view.numpy())
            else:
                pending.append(run[0])
                pending_bytes += nbytes
