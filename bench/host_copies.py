"""A checkpoint's copies to the CPU: one copy per tensor against one transfer per dtype (training/bulk.py).

    python bench/host_copies.py --device cuda    # one GPU: the 0.5B shape's adapter and AdamW moments
    python bench/host_copies.py --device cpu     # the CPU path (one copy per tensor either way but small groups)

The tensors are those a checkpoint of Qwen2.5-0.5B's shape holds with LoRA rank --rank on every projection
of its 24 layers: the adapter's 336 fp32 tensors, and AdamW's state after one step (an exp_avg and an
exp_avg_sq on the device and a step count on the CPU per parameter: 1,008 tensors). Each case copies them
--steps times after --warmup, keeping the last two results alive (as a checkpoint being written and the
adapter being served keep theirs), synchronised before and after; printed: the median and best
milliseconds of each case, per tensor (`.to("cpu", copy=True)` each, what a snapshot did) and
`host_copies`, and the ratio. The copies are compared bit for bit once.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

QWEN_05B = [(896, 896), (896, 128), (896, 128), (896, 896), (896, 4864), (896, 4864), (4864, 896)]  # q k v o gate up down


def _tensors(device: str, rank: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    shapes = [s for _ in range(24) for i, o in QWEN_05B for s in ((rank, i), (o, rank))]
    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=g).to(device)) for s in shapes]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    moments = [v for p in params for v in optimizer.state[p].values() if isinstance(v, torch.Tensor)]
    return params, moments


def _time(fn: Callable[[], Any], sync: Callable[[], None], warmup: int, steps: int) -> list[float]:
    held: list[Any] = []
    for _ in range(warmup):
        held = [*held[-1:], fn()]
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        held = [*held[-1:], fn()]
        sync()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    from groupwise.training.bulk import host_copies

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=15)
    args = p.parse_args()

    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    params, moments = _tensors(args.device, args.rank)
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"{card}, torch {torch.__version__}; Qwen2.5-0.5B shape, LoRA rank {args.rank}; "
          f"median / best of {args.steps} after {args.warmup}")
    print("| tensors | count | MB | per tensor ms | host_copies ms | per tensor / host_copies |")
    print("|---|---|---|---|---|---|")
    for name, group in (("adapter", params), ("AdamW state", moments)):
        one_by_one = [t.detach().to("cpu", copy=True) for t in group]
        bulk = host_copies(group)
        assert all(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
                   for a, b in zip(one_by_one, bulk)), "host_copies changed a bit"
        each = _time(lambda group=group: [t.detach().to("cpu", copy=True) for t in group], sync, args.warmup, args.steps)
        flat = _time(lambda group=group: host_copies(group), sync, args.warmup, args.steps)
        mb = sum(t.numel() * t.element_size() for t in group) / 2**20
        print(f"| {name} | {len(group)} | {mb:.0f} | {statistics.median(each) * 1e3:.2f} / {min(each) * 1e3:.2f} | "
              f"{statistics.median(flat) * 1e3:.2f} / {min(flat) * 1e3:.2f} | "
              f"{statistics.median(each) / statistics.median(flat):.2f}x |")


if __name__ == "__main__":
    main()
