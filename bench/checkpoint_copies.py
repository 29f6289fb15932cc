"""A checkpoint's copies to the CPU: one by one into pageable memory, against `host_copies`' staging buffer.

    python bench/checkpoint_copies.py --device cuda --arch qwen2.5-0.5b   # one GPU
    python bench/checkpoint_copies.py --device cuda --arch qwen2.5-7b
    python bench/checkpoint_copies.py --device cpu --arch tiny-qwen        # a smoke test (same path both sides)

The tensors are a step's checkpoint of a LoRA on every projection (bench/train_step.py's ARCHS shapes,
--rank, fp32 as the trainer keeps them): each A and B, and AdamW's two moments of each, on --device. Each
repeat times both ways, alternated, the wait for the device included: ``t.to("cpu", copy=True)`` per
tensor (what a checkpoint snapshot did) and `groupwise.training.bulk.host_copies`. Printed: the tensors,
their megabytes, the median milliseconds of each way and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def checkpoint_tensors(arch: str, rank: int, device: str) -> list:
    """A, B and AdamW's exp_avg and exp_avg_sq of each adapted projection: 4 fp32 tensors a layer's module."""
    import torch

    from train_step import ARCHS

    c = ARCHS[arch]
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = h // c["num_attention_heads"] * c["num_key_value_heads"]
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]  # q k v o gate up down
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(layers):
        for fan_in, fan_out in shapes:
            for shape in ((rank, fan_in), (fan_out, rank)):
                out += [torch.randn(shape, generator=g).to(device) for _ in range(3)]  # weight, exp_avg, exp_avg_sq
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--arch", default="qwen2.5-0.5b")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    import torch

    from groupwise.training.bulk import host_copies

    tensors = checkpoint_tensors(args.arch, args.rank, args.device)
    mb = sum(t.numel() * t.element_size() for t in tensors) / 1e6

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    ways = {"one by one (pageable)": lambda: [t.detach().to("cpu", copy=True).contiguous() for t in tensors],
            "host_copies (staging)": lambda: host_copies(tensors)}
    times: dict[str, list[float]] = {name: [] for name in ways}
    for rep in range(args.repeats + 1):  # the first round warms both up (the staging buffer is pinned there)
        for name, way in ways.items():
            sync()
            t0 = time.perf_counter()
            copies = way()
            sync()
            if rep:
                times[name].append(1000 * (time.perf_counter() - t0))
            del copies
    card = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    print(f"{args.arch} LoRA r={args.rank} checkpoint on {card}: {len(tensors)} tensors, {mb:.1f} MB, "
          f"median of {args.repeats}")
    print("| way | ms | MB/s |")
    print("|---|---|---|")
    med = {name: statistics.median(ts) for name, ts in times.items()}
    for name, ms in med.items():
        print(f"| {name} | {ms:.1f} | {mb / ms * 1000:,.0f} |")
    old, new = med["one by one (pageable)"], med["host_copies (staging)"]
    print(f"host_copies / one by one: {old / new:.2f}x faster")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
