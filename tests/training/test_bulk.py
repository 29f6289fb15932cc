"""An adapter's tensors checked and cloned in bulk (training/bulk.py): the answers and bits of the
one-by-one operations they replace."""

from __future__ import annotations

import math

import pytest
import torch

from groupwise.training.bulk import all_equal, all_finite, finite_flags, flat_copies, host_copies, unflat_copies
from groupwise.training.finite import non_finite_names

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (the lead runs these on the GPU machine)")])]


def _tensors(device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ts = [torch.randn(4, 3, generator=g), torch.randn(7, generator=g), torch.tensor(3.0),  # 0-dim: a step count
          torch.randn(2, 5, generator=g).to(torch.bfloat16), torch.arange(6).reshape(2, 3),  # not floating
          torch.empty(0), torch.tensor([-0.0, 3e38, -3e38, 1e-45])]  # signed zero, near-overflow, subnormal
    ts.append(torch.randn(5, 4, generator=g).t())  # not contiguous
    return [t.to(device) for t in ts]


@pytest.mark.parametrize("device", DEVICES)
def test_finite_flags_find_every_nan_and_inf(device):
    ts = _tensors(device)
    assert finite_flags(ts) == [True] * len(ts)
    for bad in (math.nan, math.inf, -math.inf):
        for k in (0, 2, 3, 6, 7):
            broken = [t.clone() for t in ts]
            broken[k][(-1,) * broken[k].dim()] = bad  # its last element
            assert finite_flags(broken) == [i != k for i in range(len(ts))], (bad, k)
    named = [(f"t{i}", t) for i, t in enumerate(ts)]
    named[1][1][0] = math.nan
    named[6][1][1] = math.inf
    assert non_finite_names(named) == ["t1", "t6"]


@pytest.mark.parametrize("device", DEVICES)
def test_flat_copies_keep_every_bit_and_do_not_change_with_the_originals(device):
    ts = _tensors(device)
    ts[0][0, 0] = math.nan
    flat = flat_copies(ts)
    assert sorted(i for idx, _ in flat for i in idx) == list(range(len(ts)))
    assert len(flat) == len({(t.device, t.dtype) for t in ts})  # one buffer per device and dtype
    expected = [_bits(t).clone() for t in ts]
    for t in ts:
        t.zero_()  # the originals change: the copies do not
    copies = unflat_copies(flat, ts)
    for t, c, bits in zip(ts, copies, expected):
        assert c.device == t.device and c.dtype == t.dtype and c.shape == t.shape
        assert torch.equal(_bits(c), bits)


@pytest.mark.parametrize("device", DEVICES)
def test_all_finite_is_false_for_any_nan_or_inf_and_reads_nothing_back(device):
    ts = _tensors(device)
    check = all_finite(ts)
    assert check.device == ts[0].device and check.dtype == torch.bool and check.dim() == 0 and bool(check)
    for bad in (math.nan, math.inf, -math.inf):
        for k in (0, 2, 3, 6, 7):
            broken = [t.clone() for t in ts]
            broken[k][(-1,) * broken[k].dim()] = bad
            assert not bool(all_finite(broken)), (bad, k)
    assert bool(all_finite([torch.arange(3, device=device)]))  # nothing floating: nothing to find


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
def test_host_copies_keep_every_bit_on_the_cpu_and_do_not_change_with_the_originals(device):
    ts = _tensors(device)
    ts[0][0, 0] = math.nan
    ts.append(torch.randn(3, 3, dtype=torch.float64, device=device))  # a third dtype: a block of its own
    copies = host_copies(ts)
    assert len(copies) == len(ts)
    for t, c in zip(ts, copies):
        assert c.device.type == "cpu" and c.dtype == t.dtype and c.shape == t.shape and c.is_contiguous()
        assert torch.equal(_bits(c), _bits(t))
    # what safetensors writes: views of one block are not refused as shared memory
    import tempfile

    from safetensors.torch import load_file, save_file
    named = {f"t{i}": c for i, c in enumerate(copies)}
    with tempfile.TemporaryDirectory() as folder:
        save_file(named, f"{folder}/x.safetensors")
        back = load_file(f"{folder}/x.safetensors")
    assert all(torch.equal(_bits(back[k]), _bits(c)) for k, c in named.items())
    before = [c.clone() for c in copies]
    for t in ts:
        t.zero_()  # a later update: the copies keep the snapshot
    assert all(torch.equal(_bits(b), _bits(c)) for b, c in zip(before, copies))
    assert host_copies([]) == []


@pytest.mark.parametrize("device", DEVICES)
def test_host_copies_gathered_in_chunks_keep_every_bit(device, monkeypatch):
    """A gather of many chunks (a tensor larger than the chunk goes alone) and a group of empty tensors only."""
    from groupwise.training import bulk

    monkeypatch.setattr(bulk, "DEVICE_CHUNK_BYTES", 20)
    ts = _tensors(device) + [torch.empty(0, dtype=torch.float64, device=device), torch.arange(3.0, device=device)]
    copies = host_copies(ts)
    for t, c in zip(ts, copies, strict=True):
        assert c.device.type == "cpu" and c.dtype == t.dtype and c.shape == t.shape
        assert torch.equal(_bits(c), _bits(t))


@pytest.mark.parametrize("chunk_bytes", [None, 20])  # the default, and a chunk per tensor (a larger one alone)
@pytest.mark.parametrize("device", DEVICES)
def test_all_equal_sees_one_changed_bit_in_any_tensor(device, chunk_bytes, monkeypatch):
    if chunk_bytes is not None:
        from groupwise.training import bulk

        monkeypatch.setattr(bulk, "DEVICE_CHUNK_BYTES", chunk_bytes)
    ts = [t for t in _tensors(device) if t.is_floating_point()]
    served = [t.to(torch.bfloat16) if t.dtype == torch.float32 else t.clone() for t in ts]  # the engine's dtype
    assert all_equal(ts, served)
    assert all_equal([], [])
    for k, t in enumerate(served):
        if not t.numel():
            continue
        changed = [s.clone() for s in served]
        flat = changed[k].reshape(-1)
        flat.view(torch.int16 if t.element_size() == 2 else torch.int32)[-1] ^= 1  # the last bit of one element
        changed[k] = flat.view(t.shape)
        assert not all_equal(ts, changed), k
    nan = [t.clone() for t in ts]
    nan[0][0, 0] = math.nan
    assert not all_equal(nan, nan)  # nan equals nothing, as the one-by-one comparison says
    with pytest.raises(ValueError):
        all_equal(ts, served[:-1])
