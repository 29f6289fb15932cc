"""An adapter's tensors checked and cloned in bulk (training/bulk.py): the answers and bits of the
one-by-one operations they replace."""

from __future__ import annotations

import math

import pytest
import torch

from groupwise.training.bulk import clones, finite_flags, host_copies
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
def test_clones_keep_every_bit_and_share_nothing(device):
    ts = _tensors(device)
    ts[0][0, 0] = math.nan
    for copies, where in ((clones(ts), device),):
        assert len(copies) == len(ts)
        for t, c in zip(ts, copies):
            assert c.device.type == where and c.dtype == t.dtype and c.shape == t.shape
            assert c.is_contiguous() or where == device  # a clone may keep the strides
            c, t = c.to("cpu"), t.to("cpu").contiguous()
            assert torch.equal(c.reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)) if t.numel() else not c.numel()
        storages = {c.untyped_storage().data_ptr() for c in copies if c.numel()}
        assert len(storages) == sum(1 for c in copies if c.numel())  # no two share memory
        before = [c.clone() for c in copies]
        for t in ts:
            t.zero_()  # the originals change: the copies do not
        assert all(torch.equal(b, c) for b, c in zip(before, copies) if not b.is_floating_point() or
                   not b.isnan().any()) and torch.isnan(copies[0][0, 0])
        ts = _tensors(device)
        ts[0][0, 0] = math.nan


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.to("cpu").contiguous(), b.to("cpu").contiguous()
    return a.dtype == b.dtype and a.shape == b.shape and (
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)) if a.numel() else True)


@pytest.mark.parametrize("device", DEVICES)
def test_host_copies_keep_every_bit_own_their_memory_and_outlive_the_next_batch(device, tmp_path):
    from safetensors.torch import load_file, save_file

    ts = _tensors(device)
    ts[0][0, 0] = math.nan
    ts.append(torch.ones(3, dtype=torch.bool, device=device))  # a 1-byte dtype between wider ones
    ts.append(torch.randn(33, device=device).to(torch.float16))  # an odd byte count before the next place
    ts.append(torch.randn(2, 3, device=device, dtype=torch.float64))
    want = [t.to("cpu", copy=True) for t in ts]
    copies = host_copies(ts)
    assert len(copies) == len(ts)
    for t, c, w in zip(ts, copies, want):
        assert c.device.type == "cpu" and c.is_contiguous() and _same_bits(c, w), (t.dtype, t.shape)
    held = [c for c in copies if c.numel()]
    assert len({c.untyped_storage().data_ptr() for c in held}) == len(held)  # no two share memory
    assert not any(c.is_pinned() for c in held)  # none is a view of the reused staging buffer
    save_file({f"t{i}": c for i, c in enumerate(copies)}, str(tmp_path / "a.safetensors"))  # refuses shared storage
    # the sources change and a larger batch goes through the same staging buffer: the first copies stay
    for t in ts:
        t.zero_() if t.dtype != torch.bool else t.logical_not_()
    bigger = [torch.randn(4096, device=device) for _ in range(8)] + ts
    again = host_copies(bigger)
    assert all(_same_bits(c, w) for c, w in zip(copies, want))
    assert all(_same_bits(c, t) for c, t in zip(again, bigger))
    loaded = load_file(str(tmp_path / "a.safetensors"))
    assert all(_same_bits(loaded[f"t{i}"], w) for i, w in enumerate(want))
