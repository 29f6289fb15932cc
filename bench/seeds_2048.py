"""Seeds x learning rates of the main job: does `groupwise train 2048` learn on every seed, and how early?

Runs ``groupwise train 2048 --seed S --lr LR`` for every pair, `--parallel` at a time (each its own
process, `--threads` CPU threads each), then prints one row per run (validation at every measured step,
the best step's gain over the base, the test) and one summary row per learning rate: the median
validation at the midpoint (how early learning takes off), the smallest and median gain, and how many
runs gained at least `--min-gain` (the issue's bar: +0.15).

    python bench/seeds_2048.py --seeds 0-9 --lrs 5e-4,1e-3                              # the 2-core CPU
    python bench/seeds_2048.py --seeds 0-19 --lrs 5e-4,1e-3 --device cuda --dtype float32 --parallel 10

On a GPU, float32 keeps the CPU's arithmetic; ten processes share one card.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def seed_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def result(run_dir: Path) -> dict:
    """The run's summary.json plus its validation by step (from history.jsonl)."""
    from groupwise import load_history

    summary = json.loads((run_dir / "summary.json").read_text())
    summary["val_by_step"] = {r["step"]: r["valid_move_rate"] for r in load_history(run_dir) if r.get("split") == "val"}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,3,5-7")
    p.add_argument("--lrs", default="1e-3", help="comma-separated learning rates")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="OMP threads per run (default: torch's own)")
    p.add_argument("--path", default=".groupwise-seeds")
    p.add_argument("--min-gain", type=float, default=0.15)
    p.add_argument("--model", default=None, help="base model (default: the job's, smollm2-135m)")
    p.add_argument("--steps", default=None, help="GRPO steps (default: the env's)")
    args = p.parse_args()

    jobs = [(lr, s) for lr in args.lrs.split(",") for s in seed_list(args.seeds)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)

    def run(job: tuple[str, int]) -> tuple[str, int, float, dict | None]:
        """One `groupwise train 2048` process; its output goes to <path>/lr<LR>/seed<S>.log."""
        lr, seed = job
        root = Path(args.path) / f"lr{lr}"
        root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "groupwise.cli", "train", "2048", "--seed", str(seed), "--lr", lr,
               "--device", args.device, "--path", str(root)]
        for flag, value in (("--dtype", args.dtype), ("--model", args.model), ("--steps", args.steps)):
            cmd += [flag, value] if value else []
        t0 = time.monotonic()
        with open(root / f"seed{seed}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        res = result(root / "2048" / f"2048-s{seed}") if rc == 0 else None
        print(f"lr {lr} seed {seed}: " + (f"best {res['trained_best']:.3f} (base {res['base']:.3f})"
                                           if res else f"failed, rc {rc}"), flush=True)
        return lr, seed, time.monotonic() - t0, res

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:  # threads only wait on their processes
        done = list(pool.map(run, jobs))

    print("\n| lr | seed | validation by step | gain of the best step | test, best checkpoint | wall |")
    print("|---|---|---|---|---|---|")
    for lr, seed, wall, res in sorted(done, key=lambda d: (float(d[0]), d[1])):
        if res is None:
            print(f"| {lr} | {seed} | failed | | | {wall / 60:.1f} min |")
            continue
        by_step = ", ".join(f"{v:.3f}" for _, v in sorted(res["val_by_step"].items()))
        print(f"| {lr} | {seed} | {by_step} | {res['trained_best'] - res['base']:+.3f} | "
              f"{res['test']['valid_move_rate']:.3f} | {wall / 60:.1f} min |")
    print("\n| lr | runs | validation at the midpoint, median | gain min / median | gained >= "
          f"{args.min_gain} |")
    print("|---|---|---|---|---|")
    for lr in args.lrs.split(","):
        ok = [r for l_, _, _, r in done if l_ == lr and r is not None]
        if not ok:
            continue
        gains = [r["trained_best"] - r["base"] for r in ok]
        mid = [sorted(r["val_by_step"].items())[len(r["val_by_step"]) // 2][1] for r in ok]
        print(f"| {lr} | {len(ok)} | {statistics.median(mid):.3f} | {min(gains):+.3f} / {statistics.median(gains):+.3f} | "
              f"{sum(g >= args.min_gain for g in gains)} of {len(ok)} |")


if __name__ == "__main__":
    main()
