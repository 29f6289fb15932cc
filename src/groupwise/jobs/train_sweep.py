"""`groupwise train <env> --seeds 0-3` / `--lr 5e-4,1e-3`: a sweep, every run at once.

One `LocalBackend` holds the base model once; each run (a seed and a learning rate) is a model of its own
on it, with its own run folder ``<env>/<env>-s<seed>[-lr<rate>]`` (resumed like a single run's), warm-started
first when the preset or ``--sft`` asks, and trained together with the others: the engine batches every
run's rollouts, the updates take turns on the shared weights, and each run trains as it would alone.
Where the runs are driven is `run_processes_for`'s choice (``--run-processes``): every run from this
process (`gw.fit_runs`, loop/sweep.py; warm starts one after another), or each from a process of its own
on this process's shared worker (jobs/train_processes.py), so that one GIL no longer serialises the runs'
requests, answers and trajectory writes. The loop's line of each step
starts with its run's name; a run that fails ends alone and the table says why. At the end, one row per
run: validation of the base and of the best checkpoint with their intervals, the best checkpoint's test,
how the run stopped and its minutes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from groupwise.jobs.train_setup import (job_backend, local_judge_model, new_model, peak_rss_gb, prepare, run_row,
                                        with_ci)

__all__ = ["DEFAULT_RUN_PROCESSES", "RunProcesses", "own_judge_copies", "run_processes_for", "sweep"]

RunProcesses = Literal["auto", "one", "each"]  # `groupwise train --run-processes`: run_processes_for
DEFAULT_RUN_PROCESSES = "auto"
EACH_MIN_ROLLOUTS = 64  # rollouts a run's step from which "auto" gives each run a process (run_processes_for)


def run_processes_for(job: Any) -> str:
    """How `job`'s sweep drives its runs: "each" (a process per run on one shared worker) or "one" (every run
    from this process). "auto" is "each" where the engine is a core process of its own on CUDA and each run's
    step has at least `EACH_MIN_ROLLOUTS` rollouts, "one" otherwise (the CPU, an in-process engine, a local
    judge of another model: `own_judge_copies`, or small steps). On an H200 four runs of 64 chat rollouts a
    step trained 1.97-2.16x the tokens/s of the runs in sequence with a process each, against 1.82x from one
    process (eight: 2.83-3.04x against 2.47x); the 2048 preset's 24 short rollouts a step trained its four
    runs in 109 s with a process each and 99 s from one, and held 2.4x the host memory (docs/benchmarks.md):
    where a step's requests are few, one GIL does not hold the runs back and the processes only cost."""
    if job.run_processes != "auto":
        return job.run_processes
    if own_judge_copies(job):
        return "one"
    from groupwise.backend.local import engine_process_for
    from groupwise.runtime.loading import resolve_device

    device_type = resolve_device(job.device).type
    engine = engine_process_for(job.engine_process, runs=len(job.runs()), device_type=device_type)
    preset = job.preset()
    big_steps = preset.groups_per_step * preset.rollouts_per_group >= EACH_MIN_ROLLOUTS
    return "each" if engine == "separate" and device_type == "cuda" and big_steps else "one"


def own_judge_copies(job: Any) -> bool:
    """Whether a process per run would load a judge model per run (`local_judge_model`: one copy for a sweep in
    one process, one per run's process otherwise; the base as judge is the worker's)."""
    return any(local_judge_model(j, job.model) for j in job.judge or ())


async def sweep(job: Any) -> dict[str, Any]:
    """Train every run of `job` (a `TrainJob`) at once; returns {"runs": [each run's summary]} (JSON-able)."""
    from groupwise.envs import get_env

    spec = get_env(job.env)
    runs = job.runs()
    metric = spec.val_metric or "reward"
    first = job.preset(runs[0][1])
    processes = run_processes_for(job)
    print(f"[groupwise train] env={spec.name} ({spec.description})")
    print(f"[groupwise train] {len(runs)} runs at once on one copy of {job.model}: seeds "
          f"{sorted({s for s, _ in runs})}, lr {sorted({job.preset(lr).learning_rate for _, lr in runs})}; "
          f"steps<={first.steps} groups/step={first.groups_per_step} rollouts/group={first.rollouts_per_group}"
          + (f"; first a warm start on {first.sft} demonstrations each" if first.sft else ""))
    t0 = time.monotonic()
    backend = job_backend(job, first, runs=len(runs), separate=processes == "each")
    if processes == "each":
        print("[groupwise train] the engine and trainer run in a core process of their own, each run's driver in a "
              "process of its own" + ("" if job.run_processes == "each" else
                                      f" (--run-processes auto on CUDA with steps of {EACH_MIN_ROLLOUTS} rollouts or more; 'one' drives "
                                      "every run from this process)"))
    elif backend.engine_process == "separate":
        print("[groupwise train] the engine and trainer run in a core process of their own, the runs' requests in this one"
              + ("" if job.engine_process == "separate" else " (--engine-process auto on CUDA; 'in_process' keeps them here)"))
    try:
        if processes == "each":
            from groupwise.jobs.train_processes import drive_each

            out = await drive_each(job, spec, backend, metric)
        else:
            out = await _drive_here(job, spec, backend, metric, t0)
    finally:
        await backend.close()
    minutes = (time.monotonic() - t0) / 60
    # each run's own process (--run-processes each) held its share beside this one and the worker: summed,
    # the peaks bound what every process held at once from above
    peak = peak_rss_gb() + sum(r.pop("_peak_gb", 0.0) for r in out)
    print()
    print(f"[groupwise train] {len(runs)} runs in {minutes:.1f} min, peak memory {peak:.1f} GB"
          + (" (this process, the worker and each run's process, summed)" if processes == "each" else ""))
    for line in table(out, metric):
        print(line)
    for r in out:
        r.pop("_points")
    return {"runs": out, "minutes": round(minutes, 2), "peak_rss_gb": round(peak, 2)}


async def _drive_here(job: Any, spec: Any, backend: Any, metric: str, t0: float) -> list[dict[str, Any]]:
    """Every run from this process: registered and warm-started one after another, then `gw.fit_runs`."""
    import groupwise as gw

    plans, entries = [], []
    for seed, lr in job.runs():
        preset = job.preset(lr)
        model = new_model(job, spec, seed, lr)
        plan, sft_steps = await prepare(job, spec, model, seed, preset, backend)
        plans.append(plan)
        entries.append((model, seed, preset, sft_steps))
    done = "loaded and warm-started" if any(e[3] for e in entries) else "loaded"
    print(f"[groupwise train] {done} in {time.monotonic() - t0:.1f}s; run folders under {Path(job.path) / spec.name}")
    results = await gw.fit_runs(plans)
    return [run_row(*entry, result, metric) for entry, result in zip(entries, results)]


def table(rows: list[dict[str, Any]], metric: str) -> list[str]:
    """The sweep's final table (markdown): per run, validation of the base and the best with their
    intervals, the best checkpoint's test with its interval, how it stopped."""
    lines = [f"| run | lr | val {metric} base | best (step) | test | stopped | minutes |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        base, best = r["_points"]
        if "error" in r:
            lines.append(f"| {r['run']} | {r['learning_rate']:g} | {with_ci(base)} | - | - | failed: {r['error']} | "
                         f"{r['minutes']:.1f} |")
            continue
        test = r["test"] or {}
        shown = "-"
        if metric in test:
            ci = f" [{test[f'{metric}_lo']:.3f}, {test[f'{metric}_hi']:.3f}]" if f"{metric}_lo" in test else ""
            shown = f"{test[metric]:.3f}{ci}"
        lines.append(f"| {r['run']} | {r['learning_rate']:g} | {with_ci(base)} | {with_ci(best)} ({r['best_step']}) | "
                     f"{shown} | {r['stop_rule']} | {r['minutes']:.1f} |")
    return lines
