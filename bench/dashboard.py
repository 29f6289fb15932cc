"""How long each view of `groupwise dashboard` takes to load on a real-size run (not a timed test).

    python bench/dashboard.py                     # writes a synthetic run into a temporary folder
    python bench/dashboard.py --dir /tmp/gw-bench # writes it there once, reuses it on later runs
    python bench/dashboard.py --summaries-only    # leaves out the run without summaries (slow: seconds a view)

The run: 200 steps of 10 groups x 5 rollouts (10,000 train trajectories, each a tool-calling
conversation whose sampled turn has 200 tokens with ids, logprobs and forced indices), validation every
10 steps, an alert every 50. It is written through the run store by the tests' writer
(tests/dashboard/dash_helpers.py), then each API the page calls is timed in process (FastAPI's test
client: the time is the readers', not the network's), each view in a fresh app: cold (its first call,
the files read for the first time by the process) and warm (the cache hit, as on every later 2 s poll).
Then the same with the step summaries moved aside, as a run written by code before summaries existed,
and last the app's background indexer (`groupwise dashboard` runs it while it serves) on that run: how
long until every step file is indexed, and the first search after it. The summaries are put back.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "dashboard"))

from fastapi.testclient import TestClient  # noqa: E402

from dash_helpers import write_step  # noqa: E402
from groupwise.dashboard.app import create_app  # noqa: E402
from groupwise.runs.store import RunStore  # noqa: E402

STEPS, GROUPS, PER_GROUP, TOKENS = 200, 10, 5, 200
RUN = "bench/agent"
VIEWS = [
    ("runs list", "/api/runs", {}),
    ("curves", "/api/curves", {"run": RUN}),
    ("judge agreement (val files)", "/api/judge", {"run": RUN}),
    ("steps", "/api/steps", {"run": RUN}),
    ("groups of the latest step", "/api/groups", {"run": RUN, "split": "train", "step": STEPS - 1}),
    ("trajectory + tokens", "/api/trajectory", {"run": RUN, "split": "train", "step": STEPS - 1, "group": 3, "index": 2}),
    ("search all 10,000 (text)", "/api/rollouts", {"run": RUN, "split": "train", "q": "scenario 7"}),
    ("best of all steps", "/api/rollouts", {"run": RUN, "split": "train"}),
    ("reward 0.2-0.5, steps 50-150", "/api/rollouts", {"run": RUN, "split": "train", "reward_min": 0.2,
                                                       "reward_max": 0.5, "step_min": 50, "step_max": 150}),
    ("compare val 0 vs latest", "/api/compare", {"run": RUN, "split": "val", "a": "0", "b": "latest"}),
]


def write_run(root: Path) -> None:
    store = RunStore(root, "bench", "agent")
    if (store.run_dir / "trajectories" / "train" / f"{STEPS - 1:04d}.jsonl").exists():
        print(f"reusing the run in {store.run_dir}")
        return
    t0 = time.perf_counter()
    for step in range(STEPS):
        write_step(store, step, n_groups=GROUPS, per_group=PER_GROUP, val_every=10, n_tokens=TOKENS,
                   alert_at=step if step % 50 == 25 else None)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    print(f"wrote {STEPS} steps x {GROUPS * PER_GROUP} train trajectories = {STEPS * GROUPS * PER_GROUP} "
          f"({size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.1f} s")


def table(root: Path, title: str) -> None:
    print(f"\n{title}\n{'view':<32}{'cold ms':>10}{'warm ms':>10}{'bytes':>10}")
    for name, path, params in VIEWS:
        client = TestClient(create_app(root))  # a fresh app per view: its first call is cold
        times = []
        for _ in range(2):
            t = time.perf_counter()
            r = client.get(path, params=params)
            times.append((time.perf_counter() - t) * 1000)
            assert r.status_code == 200, r.text
        print(f"{name:<32}{times[0]:>10.0f}{times[1]:>10.0f}{len(r.content):>10}", flush=True)


def without_summaries(root: Path) -> None:
    summaries = sorted(root.rglob("*.summary.json"))
    print(f"({len(summaries)} summaries, {sum(f.stat().st_size for f in summaries) / 2**20:.1f} MiB)")
    for f in summaries:
        f.rename(f.with_name(f.name + ".aside"))
    try:
        table(root, "the same run as code that wrote no summaries left it (the step files are parsed)")
        # what `groupwise dashboard` does while it runs: index every file in the background (nice 19)
        t = time.perf_counter()
        with TestClient(create_app(root)) as live:
            while True:
                progress = live.get("/api/indexed", params={"run": RUN}).json()
                if progress["indexed"] == progress["files"]:
                    break
                time.sleep(0.5)
            waited = time.perf_counter() - t
            t = time.perf_counter()
            found = live.get("/api/rollouts", params={"run": RUN, "split": "train", "q": "scenario 7"}).json()["total"]
            print(f"without summaries, background index of all {progress['files']} step files: {waited:.0f} s; then "
                  f"the first text search ({found} found): {(time.perf_counter() - t) * 1000:.0f} ms")
    finally:
        for f in summaries:
            f.with_name(f.name + ".aside").rename(f)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="write the run here (once) and reuse it; default: a temporary folder")
    ap.add_argument("--summaries-only", action="store_true", help="leave out the run without summaries")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.dir) if args.dir else Path(tmp)
        write_run(root)
        table(root, "a run written with step summaries (the store writes one beside each step file)")
        if not args.summaries_only:
            without_summaries(root)
        print(f"\n({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; cold: a fresh app's first call, "
              "files read for the first time by this process; warm: its cache hit, as on each 2 s poll)")


if __name__ == "__main__":
    main()
