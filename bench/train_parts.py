"""Where a GRPO step's train phase goes when several runs share one base: wall-clock time per run and step
in each part of `model.train`, for N runs registered on one `LocalBackend`.

    python bench/train_parts.py                                   # one GPU, 4 runs of the Qwen2.5-0.5B shape
    python bench/train_parts.py --device cpu --arch tiny-qwen --completion-len 8   # a smoke test

A step: each run gathers --prompts x --group-size rollouts of one chat request (bench/many_runs.py's
`chat_groups`, --completion-len tokens), then every run's `model.train` starts at once. After --warmup steps,
timers wrap the parts below (a bench's look inside, not an API: it rebinds module functions), and the
timed steps print the train phase's wall time and each part's, in milliseconds per run and step. Parts
nest (the train step holds the toggle, the adapter switch and the guarded optimizer step, which waits for the
device once for the loss, the gradient norm and the finiteness check) and the
timers do not synchronise the device: a part that waits for the device carries the wait.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

PARTS = [  # (module, function or Class.method, the label printed)
    ("groupwise.training.trainer", "Trainer.train_step", "Trainer.train_step"),
    ("groupwise.training.trainer", "Trainer._accumulate", "  forward and backward"),
    ("groupwise.training.trainer", "Trainer._set_mode", "  train/eval toggle"),
    ("groupwise.training.trainer", "Trainer._activate", "  taking the adapter back"),
    ("groupwise.training.finite", "guarded_step", "  clip, guarded optimizer step, read-back"),
    ("groupwise.training.finite", "non_finite_names", "finiteness checks"),
    ("groupwise.training.checkpoint", "snapshot_checkpoint", "checkpoint snapshot"),
    ("groupwise.training.optimizer_state", "optimizer_to_tensors", "  optimizer state to the CPU"),
    ("groupwise.training.tokenize", "tokenize_groups", "tokenising the rollouts"),
    ("groupwise.backend.replica", "Replica.serve", "serving the new adapter"),
    ("groupwise.backend.replica", "Replica.check_adapter", "checking the served adapter"),
]
USERS = ["groupwise.training.trainer", "groupwise.training.finite", "groupwise.training.checkpoint",
         "groupwise.backend.replica", "groupwise.backend.driver"]  # modules that import the functions by name


def install_timers(totals: collections.Counter) -> None:
    for module, qual, label in PARTS:
        owner: Any = importlib.import_module(module)
        *path, name = qual.split(".")
        for attr in path:
            owner = getattr(owner, attr)
        original = getattr(owner, name)

        def timed(*args: Any, __f: Any = original, __label: str = label, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return __f(*args, **kwargs)
            finally:
                totals[__label] += time.perf_counter() - t0

        setattr(owner, name, timed)
        if not path:
            for user in USERS:
                m = importlib.import_module(user)
                if m.__name__ != module and getattr(m, name, None) is original:
                    setattr(m, name, timed)


async def run(args: Any) -> None:
    import groupwise as gw
    from many_runs import chat_groups, random_model

    backend = gw.LocalBackend(path=tempfile.mkdtemp(prefix="gw-parts-"), device=args.device,
                              best_checkpoint_metric=None, served_steps=1, serve_http=False, load_model=random_model,
                              lora=gw.LoraConfig(rank=args.rank, alpha=2 * args.rank),
                              max_batch_size=args.runs * args.prompts * args.group_size)
    models = [gw.TrainableModel(f"run{r}", project="bench", base_model=f"random:{args.arch}") for r in range(args.runs)]
    for m in models:
        await m.register(backend)

    totals: collections.Counter = collections.Counter()
    try:
        for step in range(args.warmup + args.steps):
            if step == args.warmup:
                install_timers(totals)
            groups = await asyncio.gather(*(chat_groups(m, r, step, prompts=args.prompts, group_size=args.group_size,
                                                        completion_len=args.completion_len)
                                            for r, m in enumerate(models)))
            t0 = time.perf_counter()
            await asyncio.gather(*(m.train(g, config=gw.TrainConfig(learning_rate=1e-3 * (1 + r / 2),
                                                                     micro_batch_tokens=args.micro_batch_tokens))
                                   for r, (m, g) in enumerate(zip(models, groups))))
            if step >= args.warmup:
                totals["the train phase (wall)"] += time.perf_counter() - t0
    finally:
        await backend.close()
    n = args.runs * args.steps
    print(f"{args.runs} runs of random:{args.arch} on {args.device}, {args.steps} timed steps; ms per run and step:")
    for label in ["the train phase (wall)", *(p[2] for p in PARTS)]:
        print(f"  {label:<32} {totals[label] * 1e3 / n:8.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--arch", default="qwen2.5-0.5b", help="a shape of bench/train_step.py's ARCHS (random weights)")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
