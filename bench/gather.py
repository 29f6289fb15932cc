"""Gather overhead per rollout: 10,000 instant rollouts, with and without the progress bar.

    python bench/gather.py [--rollouts 10000] [--group-size 18] [--repeats 3]
    python bench/gather.py --repeats 5 --write-docs    # the table of docs/benchmarks.md

`--write-docs` writes the table between docs/benchmarks.md's ``<!-- bench:gather -->`` markers
(bench/results_block.py), with the command, commit, machine and its load when the run started: the
figures are per-rollout microseconds, which a busy machine inflates.

An "instant" rollout returns a prebuilt Trajectory without awaiting anything, so the time measured is
groupwise's bookkeeping (tasks, callbacks, result slots, progress) plus asyncio's own cost of a task.
`asyncio.gather` of the same coroutines is printed as the floor: no framework can do less than one
task per rollout if the rollouts are to run concurrently. Target: < 0.2 ms per rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_block import BENCHMARKS, commit, machine, provenance, this_command, write_block  # noqa: E402

from groupwise import Trajectory, TrajectoryGroup, gather_trajectory_groups

TRAJ = Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=1.0)


async def instant() -> Trajectory:
    return TRAJ


async def run_plain(n: int) -> float:
    coros = [instant() for _ in range(n)]
    t0 = time.perf_counter()
    await asyncio.gather(*coros)
    return time.perf_counter() - t0


async def run_groupwise(n: int, group_size: int, pbar_desc: str | None, max_concurrency: int | None) -> float:
    n_groups = n // group_size
    sizes = [group_size] * n_groups + ([n - n_groups * group_size] if n % group_size else [])
    groups = [TrajectoryGroup(instant() for _ in range(size)) for size in sizes]  # built outside the timer
    t0 = time.perf_counter()
    out = await gather_trajectory_groups(groups, pbar_desc=pbar_desc, max_concurrency=max_concurrency)
    elapsed = time.perf_counter() - t0
    assert sum(len(g) for g in out) == n, "every rollout must come back"
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=10_000)
    ap.add_argument("--group-size", type=int, default=18)
    ap.add_argument("--repeats", type=int, default=3, help="median of this many runs")
    ap.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md's gather table")
    args = ap.parse_args()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    n = args.rollouts
    devnull = open(os.devnull, "w")
    cases = [
        ("asyncio.gather (floor)", lambda: run_plain(n)),
        ("gather_trajectory_groups, no bar", lambda: run_groupwise(n, args.group_size, None, None)),
        ("gather_trajectory_groups, tqdm bar", lambda: run_groupwise(n, args.group_size, "bench", None)),
        ("gather_trajectory_groups, max_concurrency=64", lambda: run_groupwise(n, args.group_size, None, 64)),
    ]
    per_rollout: dict[str, float] = {}
    print(f"{n} instant rollouts in groups of {args.group_size}, median of {args.repeats} runs, "
          f"python {sys.version.split()[0]}, {os.cpu_count()} cpu(s)")
    print(f"{'case':<46} {'total ms':>9} {'ms/rollout':>11} {'target':>8}")
    for name, make in cases:
        times = []
        for _ in range(args.repeats):
            stderr, sys.stderr = sys.stderr, devnull  # keep the bar out of the table
            try:
                times.append(asyncio.run(make()))
            finally:
                sys.stderr = stderr
        t = statistics.median(times)
        per = t / n * 1e3
        verdict = "" if name.startswith("asyncio") else ("ok" if per < 0.2 else "MISSED")
        print(f"{name:<46} {t * 1e3:>9.1f} {per:>11.4f} {verdict:>8}")
        per_rollout[name] = per
    if args.write_docs:
        head = provenance(command=this_command(), commit_id=commit(), machine_text=machine(), day=None)
        write_block(BENCHMARKS, "gather", docs_table(per_rollout, n=n, group_size=args.group_size,
                                                     repeats=args.repeats, load=load, header=head))


# The docs' names of the cases: the code they time.
SHOWN = {"asyncio.gather (floor)": "`asyncio.gather` of the same coroutines (the floor)",
         "gather_trajectory_groups, no bar": "`gather_trajectory_groups`, no bar",
         "gather_trajectory_groups, tqdm bar": "`gather_trajectory_groups`, tqdm bar",
         "gather_trajectory_groups, max_concurrency=64": "`gather_trajectory_groups`, `max_concurrency=64`"}


def docs_table(per_rollout: dict[str, float], *, n: int, group_size: int, repeats: int, load: float | None,
               header: str) -> str:
    """docs/benchmarks.md's table: ms per rollout of each case, with where and how it was measured."""
    busy = f" Load average {load:.1f} when it started." if load is not None else ""
    lines = [f"{header} {n:,} instant rollouts in groups of {group_size}, medians of {repeats}.{busy}", "",
             "| case | ms per rollout |", "|---|---|"]
    lines += [f"| {SHOWN.get(name, name)} | {per:.3f} |" for name, per in per_rollout.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
