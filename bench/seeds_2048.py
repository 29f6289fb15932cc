"""Seeds x learning rates of the main job: does `groupwise train 2048` learn on every seed, and how early?

Runs ``groupwise train 2048 --seed S`` (with `--lr LR` for each of `--lrs`, else the env preset's rate;
`--env` names other envs, e.g. ``--env tictactoe,tictactoe-minimax,math``) for every seed, `--parallel`
at a time (each its own process, `--threads` CPU threads each), then prints one row per run (validation
base and best with intervals, the gain, the test of the best checkpoint, wall time, peak memory) and,
for several rates, one summary row per rate: the median validation at the midpoint (how early learning
takes off), the smallest and median gain, and how many runs gained at least `--min-gain` (the issue's
bar: +0.15). Every run's result goes to <path>/results.json.

`--write-readme` writes the README's results table and `--write-docs` the table of docs/benchmarks.md
(between their ``<!-- bench:seeds_2048 -->`` markers, or `--block`'s; bench/results_block.py), each with
the command, commit and machine it was measured on and the exact `groupwise train` line of a row: run
that line with a listed seed to reproduce its row. `--batch-invariant` is on by default for that
reason: without it the engine's batching changes the logits' last bits, a flipped token parts two runs
of one seed, and a row reproduces only roughly. `--from-json` writes the tables of a saved results.json
without training.

    python bench/seeds_2048.py --seeds 0-9 --threads 2 --write-readme --write-docs  # the 2-core CPU tables
    python bench/seeds_2048.py --seeds 2-21 --lrs 5e-4,1e-3 --device cuda --dtype float32 --threads 1 --parallel 12
    python bench/seeds_2048.py --env tictactoe,tictactoe-minimax,math --seeds 0-2 --threads 2 --write-docs \
        --block seeds_other_envs                                                  # the other envs' CPU table

On a GPU, float32 keeps the CPU's arithmetic; ten processes share one card.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_block import BENCHMARKS, README, commit, machine, provenance, this_command, write_block  # noqa: E402

NAME = "seeds_2048"


def seed_list(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def job_flags(args: argparse.Namespace, lr: str | None) -> list[str]:
    """The `groupwise train` flags of a run, but the env, the seed and the run store: what a row needs to
    be reproduced."""
    flags = ["--device", args.device]
    for flag, value in (("--lr", lr), ("--dtype", args.dtype), ("--model", args.model), ("--steps", args.steps)):
        flags += [flag, str(value)] if value else []
    return flags + (["--batch-invariant"] if args.batch_invariant else [])


def row_command(flags: list[str], threads: int | None, seed: str = "S", env: str = "2048") -> str:
    omp = f"OMP_NUM_THREADS={threads} " if threads else ""
    return f"{omp}groupwise train {env} --seed {seed} {shlex.join(flags)}"


def metric(summary: dict) -> str:
    """The env's validation metric (summary.json's "val/<metric>")."""
    return summary["metric"].removeprefix("val/")


def result(run_dir: Path) -> dict:
    """The run's summary.json plus its validation by step (from history.jsonl)."""
    from groupwise import load_history

    summary = json.loads((run_dir / "summary.json").read_text())
    key = metric(summary)
    summary["val_by_step"] = {r["step"]: r[key] for r in load_history(run_dir) if r.get("split") == "val"}
    return summary


def measure(args: argparse.Namespace) -> dict:
    lrs: list[str | None] = list(args.lrs.split(",")) if args.lrs else [None]
    envs = args.env.split(",")
    jobs = [(env, lr, s) for env in envs for lr in lrs for s in seed_list(args.seeds)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if args.threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)

    def run(job: tuple[str, str | None, int]) -> dict:
        """One `groupwise train` process; its output goes to <path>/<env>/lr<LR>/seed<S>.log."""
        name, lr, seed = job
        root = Path(args.path) / name / f"lr{lr or 'preset'}"
        root.mkdir(parents=True, exist_ok=True)
        flags = job_flags(args, lr)
        cmd = [sys.executable, "-m", "groupwise.cli", "train", name, "--seed", str(seed), *flags, "--path", str(root)]
        t0 = time.monotonic()
        with open(root / f"seed{seed}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
        found = sorted(root.glob(f"*/*-s{seed}/summary.json"))  # <project>/<env>-s<seed>/: the job's names
        res = result(found[0].parent) if rc == 0 and found else None
        print(f"{name} lr {lr or 'preset'} seed {seed}: " + (f"best {res['trained_best']:.3f} (base {res['base']:.3f})"
                                                             if res else f"failed, rc {rc}"), flush=True)
        return {"env": name, "lr": lr, "seed": seed, "rc": rc, "wall_s": time.monotonic() - t0, "summary": res}

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:  # threads only wait on their processes
        runs = list(pool.map(run, jobs))
    return {"command": this_command(), "commit": commit(), "machine": machine(args.device),
            "date": date.today().isoformat(),
            "row_command": row_command(job_flags(args, lrs[0] if len(lrs) == 1 else None), args.threads,
                                       env=envs[0] if len(envs) == 1 else "ENV"),
            "parallel": args.parallel,
            "runs": sorted(runs, key=lambda r: (envs.index(r["env"]), float(r["lr"] or 0), r["seed"]))}


# ---------------------------------------------------------------- the tables (pure functions of results.json)


def _ci(value: float, interval: list[float] | None) -> str:
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else f"{value:.3f}"


def _test(s: dict) -> tuple[float, list[float] | None]:
    t, key = s["test"] or {}, metric(s)
    lo, hi = t.get(f"{key}_lo"), t.get(f"{key}_hi")
    return t.get(key, float("nan")), [lo, hi] if lo is not None else None


def _env(run: dict) -> str:
    return run.get("env", "2048")  # results.json of the 2048-only script had no env


def _lr(run: dict) -> str:
    """The run's learning rate: the one passed, else the preset's (in its summary)."""
    if run["lr"]:
        return run["lr"]
    return f"{run['summary']['learning_rate']:g}" if run["summary"] else "preset"


def _rates(runs: list[dict]) -> list[str]:
    """The learning rates of the runs (a failed run at the preset's rate has none to tell)."""
    return sorted({_lr(r) for r in runs if r["lr"] or r["summary"]}, key=float)


def _several_rates(runs: list[dict]) -> bool:
    """Whether some env ran at several rates (envs whose presets differ do not count)."""
    return any(len(_rates([r for r in runs if _env(r) == env])) > 1 for env in {_env(r) for r in runs})


def _header(m: dict) -> str:
    several = _several_rates(m["runs"])
    at_once = "one run at a time" if m.get("parallel", 1) == 1 else f"{m['parallel']} runs at a time"
    head = provenance(command=m["command"], commit_id=m["commit"], machine_text=m["machine"], day=m["date"])
    cmd = m["row_command"]
    repro = ("reproduces its row exactly on the same machine (`--batch-invariant`)" if "--batch-invariant" in cmd
             else "reproduces its row only roughly: without `--batch-invariant` the engine's batching moves the "
                  "logits' last bits")
    row = ("ENV the row's env, " if "groupwise train ENV " in cmd else "") + "S the row's seed" + (
        " and `--lr` the row's rate" if several else "")
    return f"{head} {at_once.capitalize()}; `{cmd}` ({row}) {repro}."


def _summary_sentence(runs: list[dict], bar: float) -> str:
    ok = [r["summary"] for r in runs if r["summary"]]
    failed = [str(r["seed"]) for r in runs if not r["summary"]]
    if not ok:
        return "Every run failed: " + ", ".join(f"seed {r['seed']} rc {r['rc']}" for r in runs) + "."
    gains = [s["trained_best"] - s["base"] for s in ok]
    cleared = sum(g >= bar for g in gains)
    tests = [_test(s)[0] for s in ok]
    walls = [s["wall_s"] / 60 for s in ok]
    peaks = [s["peak_rss_gb"] for s in ok]
    text = (f"{cleared} of {len(ok)} seeds beat their base by at least {bar:+.2f} (gains {min(gains):+.2f} to "
            f"{max(gains):+.2f}, mean {statistics.mean(gains):+.2f}); the held-out test of the best checkpoint "
            f"averages {statistics.mean(tests):.3f}. Wall time {min(walls):.1f}-{max(walls):.1f} minutes a run, "
            f"peak memory {min(peaks):.2f}-{max(peaks):.2f} GiB.")
    weak = [(s["trained_best"] - s["base"], s["seed"]) for s in ok if s["trained_best"] - s["base"] < bar]
    if weak:
        text += " Below the bar: " + ", ".join(f"seed {seed} ({g:+.2f})" for g, seed in sorted(weak)) + "."
    if failed:
        text += f" Failed (no summary): seed {', '.join(failed)}."
    return text


def readme_block(m: dict, bar: float = 0.15) -> str:
    """The README's table: one column per seed, the mean and the worst."""
    runs = m["runs"]
    if {_env(r) for r in runs} != {"2048"}:
        raise SystemExit("--write-readme writes the 2048 table (the README lists the main job's seeds)")
    if len(_rates(runs)) > 1:
        raise SystemExit("--write-readme takes one learning rate (the README lists the job's seeds at one rate)")
    ok = [r["summary"] for r in runs if r["summary"]]
    seeds = [r["seed"] for r in runs]
    cells: dict[str, list[str]] = {"validation base": [], "validation best": [], "gain": [], "test": [], "minutes": []}
    for r in runs:
        s = r["summary"]
        if s is None:
            for k in cells:
                cells[k].append("failed")
            continue
        cells["validation base"].append(f"{s['base']:.3f}")
        cells["validation best"].append(f"{s['trained_best']:.3f}")
        cells["gain"].append(f"{s['trained_best'] - s['base']:+.2f}")
        cells["test"].append(f"{_test(s)[0]:.3f}")
        cells["minutes"].append(f"{s['wall_s'] / 60:.1f}")
    if ok:
        worst = min(ok, key=lambda s: s["trained_best"])
        gains = [s["trained_best"] - s["base"] for s in ok]
        tests = [_test(s)[0] for s in ok]
        walls = [s["wall_s"] / 60 for s in ok]
        extra = {"validation base": (f"{statistics.mean(s['base'] for s in ok):.3f}", ""),
                 "validation best": (f"{statistics.mean(s['trained_best'] for s in ok):.3f}",
                                     f"{worst['trained_best']:.3f} (seed {worst['seed']})"),
                 "gain": (f"{statistics.mean(gains):+.2f}", f"{min(gains):+.2f}"),
                 "test": (f"{statistics.mean(tests):.3f}", f"{min(tests):.3f}"),
                 "minutes": (f"{statistics.mean(walls):.1f}", f"{max(walls):.1f}")}
        for k in cells:
            cells[k] += list(extra[k])
    lines = [_header(m), "",
             "| seed | " + " | ".join(map(str, seeds)) + (" | mean | worst |" if ok else " |"),
             "|---|" + "---|" * (len(seeds) + (2 if ok else 0))]
    lines += [f"| {k} | " + " | ".join(v) + " |" for k, v in cells.items()]
    return "\n".join([*lines, "", _summary_sentence(runs, bar)])


def docs_block(m: dict, bar: float = 0.15) -> str:
    """docs/benchmarks.md's tables: one row per run with intervals (an env column for several envs), one
    sentence per env; with several rates, one row per env and rate."""
    runs = m["runs"]
    envs = list(dict.fromkeys(_env(r) for r in runs))
    several_envs, several_rates = len(envs) > 1, _several_rates(runs)
    head = ("| env (metric) " if several_envs else "") + ("| lr " if several_rates else "")
    lines = [_header(m), "", head + "| seed | validation base | validation best | gain | test, best checkpoint "
             "| wall | peak RSS |", "|---" * (7 + several_envs + several_rates) + "|"]
    shown = None
    for r in runs:
        lead = ""
        if several_envs:
            ok = next((x["summary"] for x in runs if _env(x) == _env(r) and x["summary"]), None)
            label = f"{_env(r)} ({metric(ok)})" if ok else _env(r)
            lead += f"| {label if _env(r) != shown else ''} "
            shown = _env(r)
        lead += f"| {_lr(r)} " if several_rates else ""
        s = r["summary"]
        if s is None:
            lines.append(f"{lead}| {r['seed']} | failed (rc {r['rc']}) | | | | {r['wall_s'] / 60:.1f} min | |")
            continue
        lines.append(f"{lead}| {r['seed']} | {s['base']:.3f} | {_ci(s['trained_best'], s['best_interval'])} "
                     f"(step {s['best_step']}) | {s['trained_best'] - s['base']:+.3f} | {_ci(*_test(s))} | "
                     f"{s['wall_s'] / 60:.1f} min | {s['peak_rss_gb']:.2f} GiB |")
    lines.append("")
    for env in envs:
        sentence = _summary_sentence([r for r in runs if _env(r) == env], bar)
        lines.append(f"{env}: {sentence}" if several_envs else sentence)
    if several_rates:
        lines += ["", ("| env " if several_envs else "") + "| lr | runs | validation at the midpoint, median | "
                  f"gain min / median | gained >= {bar:+.2f} |", "|---" * (5 + several_envs) + "|"]
        for env in envs:
            for lr in _rates([r for r in runs if _env(r) == env]):
                ok = [r["summary"] for r in runs if _env(r) == env and _lr(r) == lr and r["summary"]]
                if not ok:
                    continue
                gains = [s["trained_best"] - s["base"] for s in ok]
                mid = [sorted(s["val_by_step"].items(), key=lambda kv: int(kv[0]))[len(s["val_by_step"]) // 2][1]
                       for s in ok]
                lines.append(("| " + env + " " if several_envs else "") + f"| {lr} | {len(ok)} | "
                             f"{statistics.median(mid):.3f} | {min(gains):+.3f} / {statistics.median(gains):+.3f} | "
                             f"{sum(g >= bar for g in gains)} of {len(ok)} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="2048", help="comma-separated envs (default: the main job's, 2048)")
    p.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 0,3,5-7")
    p.add_argument("--lrs", default=None, help="comma-separated learning rates (default: the env preset's rate)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default=None)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="OMP threads per run (default: torch's own)")
    p.add_argument("--path", default=".groupwise-seeds")
    p.add_argument("--min-gain", type=float, default=0.15)
    p.add_argument("--model", default=None, help="base model (default: the job's, smollm2-135m)")
    p.add_argument("--steps", default=None, help="GRPO steps (default: the env's)")
    p.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=True,
                   help="pass --batch-invariant to every run, so a row reproduces exactly on the same machine")
    p.add_argument("--from-json", default=None, help="write the tables of this results.json instead of training")
    p.add_argument("--write-readme", action="store_true", help="rewrite the README's block (one learning rate)")
    p.add_argument("--write-docs", action="store_true", help="rewrite docs/benchmarks.md's block")
    p.add_argument("--block", default=NAME, help="the docs/benchmarks.md block --write-docs rewrites")
    args = p.parse_args()

    if args.from_json:
        m = json.loads(Path(args.from_json).read_text())
    else:
        m = measure(args)
        Path(args.path).mkdir(parents=True, exist_ok=True)
        (Path(args.path) / "results.json").write_text(json.dumps(m, indent=2))
    print("\n" + docs_block(m, args.min_gain))
    if args.write_readme:
        write_block(README, NAME, readme_block(m, args.min_gain))
    if args.write_docs:
        write_block(BENCHMARKS, args.block, docs_block(m, args.min_gain))


if __name__ == "__main__":
    main()
