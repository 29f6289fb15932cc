"""A checkpoint's tensor files written and fingerprinted on a thread, four ways, and how much of its time
a Python thread beside the writer keeps.

    python bench/checkpoint_write.py            # the 0.5B shape's rank-16 adapter and AdamW moments
    python bench/checkpoint_write.py --rank 64
    python bench/checkpoint_write.py --device cuda  # the snapshot copied from a GPU (one block per dtype)

The worker writes a run's checkpoint on a thread while its other threads update the next run and step
the engine, all Python under one GIL. The tensors are those of a checkpoint of Qwen2.5-0.5B's shape with
LoRA on every projection of its 24 layers (the adapter's 336 fp32 tensors and AdamW's two moments each),
as CPU copies in one block per dtype (`host_copies`, as a snapshot holds them). A checkpoint records each
file's size and SHA-256, so a case is the adapter's and the moments' files written and fingerprinted:

- safetensors' `save_file`, then the two files read back and hashed side by side;
- `save_tensors` (runtime/tensor_files.py), then read back the same way;
- `save_tensors`, each file hashed from its buffers as they are written, one file after the other;
- the same on two threads, a file each (the checkpoint's way where there are more than two cores,
  training/checkpoint.py; one file at a time on two).

Each case writes --files checkpoints on a thread while the main thread runs small torch ops in a loop (as
a launch-bound update does: a little Python between ops); its ops a second against the same loop alone,
just before, are the share of its pace the writer left it (on a machine of few cores, the writer's threads
also take cores from it: hashing is CPU work). Printed: per case the seconds a checkpoint's two files took
and that share, then the checkpoint's way on this machine against the second case's.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from groupwise.runtime.compute import usable_cores
from groupwise.runtime.tensor_files import file_fingerprint, save_tensors
from groupwise.training.bulk import host_copies

QWEN_05B = [(896, 896), (896, 128), (896, 128), (896, 896), (896, 4864), (896, 4864), (4864, 896)]  # q k v o gate up down


def _checkpoint(rank: int, device: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A snapshot's CPU copies of the adapter and the moments, copied from `device` as `host_copies` does."""
    shapes = [s for _ in range(24) for i, o in QWEN_05B for s in ((rank, i), (o, rank))]
    g = torch.Generator().manual_seed(0)
    adapter = host_copies([torch.randn(s, generator=g).to(device) for s in shapes])
    moments = host_copies([torch.randn(s, generator=g).to(device) for s in shapes for _ in range(2)])
    return ({f"a{i}": t for i, t in enumerate(adapter)}, {f"m{i}::exp_avg": t for i, t in enumerate(moments)})


def _ops_per_s(seconds: float) -> float:
    """Small torch ops a second on this thread alone (what a launch-bound update does: Python between ops)."""
    x = torch.zeros(8)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        x.add_(1.0)
        n += 1
    return n / (time.perf_counter() - t0)


def _case(write, files: tuple[dict, dict], folder: Path, repeats: int) -> tuple[float, float]:
    """(seconds per checkpoint, small torch ops a second on the main thread meanwhile)."""
    done = threading.Event()
    took: list[float] = []

    def writer() -> None:
        for i in range(repeats):
            t0 = time.perf_counter()
            write(files, [folder / f"adapter{i}.safetensors", folder / f"optimizer{i}.safetensors"])
            took.append(time.perf_counter() - t0)
        done.set()

    thread = threading.Thread(target=writer)
    x = torch.zeros(8)
    n, t0 = 0, time.perf_counter()
    thread.start()
    while not done.is_set():
        x.add_(1.0)
        n += 1
    elapsed = time.perf_counter() - t0
    thread.join()
    return sorted(took)[len(took) // 2], n / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--device", default="cpu", help="where the tensors are copied from (cuda: one page-locked "
                   "block per dtype, as a GPU run's snapshot; cpu: a copy per large tensor)")
    p.add_argument("--files", type=int, default=5, help="checkpoints written per case")
    p.add_argument("--rounds", type=int, default=3, help="the two cases alternate this many times")
    args = p.parse_args()
    from safetensors.torch import save_file

    files = _checkpoint(args.rank, args.device)
    mb = sum(t.numel() * t.element_size() for f in files for t in f.values()) / 1e6
    def read_back(write):
        def case(tensors, paths):
            for t, path in zip(tensors, paths):
                write(t, path)
            with ThreadPoolExecutor(2) as pool:
                return list(pool.map(file_fingerprint, paths))
        return case

    def hashed_while_written(tensors, paths):
        with ThreadPoolExecutor(2) as pool:
            return list(pool.map(save_tensors, tensors, paths))

    cases = {"save_file, read back": read_back(lambda t, path: save_file(t, str(path))),
             "save_tensors, read back": read_back(lambda t, path: save_tensors(t, path, fingerprint=False)),
             "save_tensors, hashed as written, one file at a time": lambda tensors, paths: list(
                 map(save_tensors, tensors, paths)),
             "save_tensors, hashed as written": hashed_while_written}
    shares: dict[str, list[float]] = {name: [] for name in cases}
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name, write in cases.items():
                alone = _ops_per_s(1.0)
                s, ops = _case(write, files, Path(tmp), args.files)
                seconds[name].append(s)
                shares[name].append(ops / alone)
    print(f"a checkpoint of the 0.5B shape, LoRA rank {args.rank}, copied from {args.device}: {sum(len(f) for f in files)} tensors, {mb:.0f} MB; "
          f"median of {args.rounds} rounds of {args.files} checkpoints")
    print("| writer | s a checkpoint | pace a thread beside it keeps |")
    print("|---|---|---|")
    med = {name: sorted(v)[len(v) // 2] for name, v in shares.items()}
    for name in cases:
        print(f"| {name} | {sorted(seconds[name])[len(seconds[name]) // 2]:.3f} | {med[name]:.0%} |")
    secs = {name: sorted(v)[len(v) // 2] for name, v in seconds.items()}
    # the way the checkpoint takes on this machine (training/checkpoint.py) against the code before it
    cores = usable_cores()
    new = "save_tensors, hashed as written" + ("" if cores > 2 else ", one file at a time")
    old = "save_tensors, read back"
    print(f"{new} ({cores} cores: the checkpoint's way here) / {old}: {secs[new] / secs[old]:.2f}x the seconds, "
          f"{med[new] / med[old]:.2f}x the pace a thread beside the writer keeps")


if __name__ == "__main__":
    main()
