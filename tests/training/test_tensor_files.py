"""runtime/tensor_files.py: `save_tensors` writes what safetensors' own writer writes, read back by safetensors.
What it is for, the GIL let go while it writes, is a speed: bench/checkpoint_write.py measures it."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from groupwise.runtime.tensor_files import file_fingerprint, save_tensors
from groupwise.training.bulk import host_copies


def _mixed() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "lora_A.weight": torch.randn(16, 24, generator=g),
        "lora_B.weight": torch.randn(24, 16, generator=g).to(torch.bfloat16),
        "half": torch.randn(3, 5, generator=g).half(),
        "double": torch.randn(7, generator=g, dtype=torch.float64),
        "rng_state": torch.randint(0, 255, (5,), dtype=torch.uint8, generator=g),  # an odd byte count first...
        "after_odd": torch.randn(3, generator=g),  # ...then a float32: still aligned (the library's order)
        "mask": torch.tensor([True, False, True]),
        "count": torch.tensor(7, dtype=torch.int64),  # 0-dim
        "empty": torch.empty(0, 4),
        "named ü/::exp_avg": torch.arange(6, dtype=torch.int32).reshape(2, 3),
    }


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_save_tensors_reads_back_as_the_librarys_writer_does(tmp_path, metadata):
    tensors = _mixed()
    save_tensors(tensors, tmp_path / "ours.safetensors", metadata=metadata)
    save_file(tensors, str(tmp_path / "theirs.safetensors"), metadata=metadata)
    ours, theirs = load_file(tmp_path / "ours.safetensors"), load_file(tmp_path / "theirs.safetensors")
    assert ours.keys() == theirs.keys() == tensors.keys()
    for name, t in tensors.items():
        assert ours[name].dtype == t.dtype and ours[name].shape == t.shape, name
        assert torch.equal(_bits(ours[name]), _bits(t)) and torch.equal(_bits(ours[name]), _bits(theirs[name])), name
    with safe_open(tmp_path / "ours.safetensors", "pt") as f, safe_open(tmp_path / "theirs.safetensors", "pt") as g:
        assert f.metadata() == g.metadata()
    # the layout: the header's length, a header padded to 8 bytes, every tensor at a multiple of its size
    raw = (tmp_path / "ours.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and len(raw) == 8 + n + sum(t.numel() * t.element_size() for t in tensors.values())
    header = json.loads(raw[8:8 + n])
    for name, t in tensors.items():
        assert header[name]["data_offsets"][0] % t.element_size() == 0, name


def test_save_tensors_writes_a_snapshots_views_of_one_block(tmp_path):
    # a checkpoint's snapshot: views into one block per dtype (training/bulk.py)
    sources = [torch.randn(4, 8), torch.randn(8, 4), torch.randn(3).to(torch.bfloat16), torch.randn(2, 2)]
    copies = host_copies(sources)
    named = {f"t{i}": c for i, c in enumerate(copies)}
    save_tensors(named, tmp_path / "x.safetensors")
    back = load_file(tmp_path / "x.safetensors")
    assert all(torch.equal(_bits(back[k]), _bits(c)) for k, c in named.items())


def _on_disk(path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("case", ["mixed", "block", "empty"])
def test_the_fingerprint_hashed_while_writing_is_the_files(tmp_path, case):
    # what a checkpoint's state.json records for the file, hashed from the buffers as they were written
    block = host_copies([torch.randn(64, 8), torch.randn(8)])
    tensors = {"mixed": _mixed(), "block": {f"b{i}": t for i, t in enumerate(block)},
               "empty": {"e": torch.empty(0)}}[case]
    got = save_tensors(tensors, tmp_path / "x.safetensors", metadata={"format": "pt"})
    assert got == _on_disk(tmp_path / "x.safetensors") == file_fingerprint(tmp_path / "x.safetensors")
    # not asked for (an engine's adapter slot is loaded from a folder and deleted): the same file, no hash
    assert save_tensors(tensors, tmp_path / "y.safetensors", metadata={"format": "pt"}, fingerprint=False) is None
    assert _on_disk(tmp_path / "y.safetensors") == got


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 1000])
def test_a_file_read_back_in_pieces_has_the_fingerprint_of_its_bytes(tmp_path, monkeypatch, size):
    from groupwise.runtime import tensor_files

    monkeypatch.setattr(tensor_files, "READ_BYTES", 64)  # many reads, and a last one short or empty
    (tmp_path / "f").write_bytes((bytes(range(256)) * 4)[:size])
    assert file_fingerprint(tmp_path / "f") == _on_disk(tmp_path / "f")


def test_the_librarys_writer_is_read_back_for_its_fingerprint(tmp_path):
    # a dtype this writer does not name (complex) goes to safetensors' writer: the fingerprint is then
    # the file read back
    t = torch.arange(5.0).to(torch.complex64)
    got = save_tensors({"c": t, "r": torch.arange(3.0)}, tmp_path / "x.safetensors")
    assert got == _on_disk(tmp_path / "x.safetensors")
    assert torch.equal(load_file(tmp_path / "x.safetensors")["c"], t)


def test_what_the_format_cannot_take_goes_to_the_librarys_writer(tmp_path):
    # not contiguous: the library's own error, as before
    with pytest.raises(ValueError, match="non contiguous"):
        save_tensors({"t": torch.randn(4, 4).t()}, tmp_path / "x.safetensors")



def test_parameters_and_empty_tensors_are_written_as_the_library_writes_them(tmp_path):
    # a model's own parameters (they require grad) are written as their values
    params = {"w": torch.nn.Parameter(torch.randn(4, 4)), "b": torch.nn.Parameter(torch.randn(4))}
    save_tensors(params, tmp_path / "p.safetensors")
    back = load_file(tmp_path / "p.safetensors")
    assert all(torch.equal(back[k], p.detach()) for k, p in params.items())
    # nothing but empty tensors: a header and no data
    save_tensors({"e": torch.empty(0)}, tmp_path / "e.safetensors")
    assert load_file(tmp_path / "e.safetensors")["e"].shape == (0,)


def test_a_snapshots_blocks_cross_in_one_write_each_and_scattered_tensors_are_joined(tmp_path, monkeypatch):
    """Each `write` takes the GIL back (the module doc): a 1,000-tensor checkpoint must not be 1,000 writes."""
    from groupwise.runtime import tensor_files

    writes: list[int] = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            writes.append(len(memoryview(data).cast("B")))
            return self.f.write(data)

    monkeypatch.setattr(tensor_files, "open", lambda path, mode: Counting(open(path, mode)), raising=False)
    block = torch.randn(500 * 16)  # a snapshot: 500 views of one block, in order
    views = {f"v{i:03d}": block[i * 16:(i + 1) * 16].view(4, 4) for i in range(500)}
    save_tensors(views, tmp_path / "views.safetensors")
    assert len(writes) == 2 and writes[1] == block.numel() * 4  # the header, then the block at once
    writes.clear()
    scattered = {f"s{i:03d}": torch.randn(4, 4) for i in range(500)}  # separate allocations
    save_tensors(scattered, tmp_path / "scattered.safetensors")
    assert len(writes) == 2 and writes[1] == 500 * 16 * 4  # joined into one buffer
    for name, src in [("views", views), ("scattered", scattered)]:
        back = load_file(tmp_path / f"{name}.safetensors")
        assert all(torch.equal(back[k], t) for k, t in src.items()), name
