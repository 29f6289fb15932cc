"""`groupwise train <env> --seeds 0-3` / `--lr 5e-4,1e-3`: a sweep, every run at once in this process.

One `LocalBackend` holds the base model once; each run (a seed and a learning rate) is a model of its own
on it, with its own run folder ``<env>/<env>-s<seed>[-lr<rate>]`` (resumed like a single run's), warm-started
first when the preset or ``--sft`` asks (one run after another), and
`gw.fit_runs` trains them together (loop/sweep.py): the engine batches every run's rollouts, the updates
take turns on the shared weights, and each run trains as it would alone. The loop's line of each step
starts with its run's name; a run that fails ends alone and the table says why. At the end, one row per
run: validation of the base and of the best checkpoint with their intervals, the best checkpoint's test,
how the run stopped and its minutes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from groupwise.jobs.train_setup import job_backend, loop_config, peak_rss_gb, score_group_of, with_ci

__all__ = ["sweep"]


def run_name(env: str, seed: int, lr: float | None, rates: int) -> str:
    """``<env>-s<seed>``, with ``-lr<rate>`` when the sweep has several rates (the single run's name otherwise)."""
    return f"{env}-s{seed}" + (f"-lr{lr:g}" if rates > 1 and lr is not None else "")


async def sweep(job: Any) -> dict[str, Any]:
    """Train every run of `job` (a `TrainJob`) at once; returns {"runs": [each run's summary]} (JSON-able)."""
    import groupwise as gw
    from groupwise.envs import get_env
    from groupwise.jobs.sft import warm_start_fields, warm_started
    from groupwise.runs.series import points

    spec = get_env(job.env)
    runs = job.runs()
    rates = len(job.lr or [None])
    metric = spec.val_metric or "reward"
    first = job.preset(runs[0][1])
    print(f"[groupwise train] env={spec.name} ({spec.description})")
    print(f"[groupwise train] {len(runs)} runs at once on one copy of {job.model}: seeds "
          f"{sorted({s for s, _ in runs})}, lr {sorted({job.preset(lr).learning_rate for _, lr in runs})}; "
          f"steps<={first.steps} groups/step={first.groups_per_step} rollouts/group={first.rollouts_per_group}"
          + (f"; first a warm start on {first.sft} demonstrations each" if first.sft else ""))
    t0 = time.monotonic()
    backend = job_backend(job, first, runs=len(runs))
    if backend.engine_process == "separate":
        print("[groupwise train] the engine and trainer run in a core process of their own, the runs' requests in this one"
              + ("" if job.engine_process == "separate" else " (--engine-process auto on CUDA; 'in_process' keeps them here)"))
    plans, models = [], []
    try:
        for seed, lr in runs:
            preset = job.preset(lr)
            train_s, val_s, test_s = spec.scenarios(seed)
            if preset.val_size is not None:
                val_s, test_s = val_s[: preset.val_size], test_s[: preset.val_size]
            model = gw.TrainableModel(name=run_name(spec.name, seed, lr, rates), project=job.project_of(),
                                      base_model=job.model, base_path=job.path)
            await model.register(backend)
            sft_steps, baselines = await warm_started(spec, preset.sft, model, seed=seed, epochs=job.sft_epochs,
                                                      learning_rate=job.sft_lr)
            judge = (job.judge or [None])[0]
            plans.append(gw.FitRun(
                model, spec.rollout, train_s,
                val_scenarios=val_s if spec.val_metric else None,
                test_scenarios=test_s if spec.val_metric else None,
                score_group=score_group_of(spec, judge, model, job.model, job.gate),
                validate=spec.validate if spec.val_metric else None,
                baselines=baselines if spec.val_metric else (),
                config=loop_config(spec, preset, preset.steps + sft_steps, seed, job.device,
                                   distill_top_k=job.distill_top_k), teacher=job.teacher))
            models.append((model, seed, preset, sft_steps))
        load_s = time.monotonic() - t0
        done = "loaded and warm-started" if any(m[3] for m in models) else "loaded"
        print(f"[groupwise train] {done} in {load_s:.1f}s; run folders under {Path(job.path) / spec.name}")
        results = await gw.fit_runs(plans)
    finally:
        await backend.close()
    minutes = (time.monotonic() - t0) / 60
    out = []
    for (model, seed, preset, sft_steps), result in zip(models, results):
        history = gw.load_history(model.run_dir)
        base = next((p for p in points(history, "val", metric) if p.step == 0), None)
        row: dict[str, Any] = {"run": model.name, "seed": seed, "learning_rate": preset.learning_rate,
                               "run_dir": str(model.run_dir), "base": base.value if base else None,
                               "base_interval": [base.lo, base.hi] if base else None,
                               "minutes": round(_minutes(history), 2)}
        if isinstance(result, BaseException):
            row.update(error=f"{type(result).__name__}: {' '.join(str(result).split())[:300]}")
        else:
            best = next((p for p in points(history, "val", metric) if p.step == result.best_step), None)
            row.update(best=result.best_value, best_interval=[best.lo, best.hi] if best else None,
                       best_step=result.best_step, final_step=result.final_step, test=result.test,
                       stop_rule=result.stop.rule, **warm_start_fields(model, sft_steps, result.baselines))
            Path(model.run_dir, "summary.json").write_text(json.dumps(row, indent=2))
        row["_points"] = (base, best if not isinstance(result, BaseException) else None)
        out.append(row)
    print()
    print(f"[groupwise train] {len(runs)} runs in {minutes:.1f} min, peak memory {peak_rss_gb():.1f} GB")
    for line in table(out, metric):
        print(line)
    for r in out:
        r.pop("_points")
    return {"runs": out, "minutes": round(minutes, 2), "peak_rss_gb": round(peak_rss_gb(), 2)}


def _minutes(history: list[dict[str, Any]]) -> float:
    """The run's minutes, from its first history row to its last (all runs share the wall clock)."""
    from datetime import datetime

    stamps = [datetime.fromisoformat(r["recorded_at"]) for r in history if isinstance(r.get("recorded_at"), str)]
    return (max(stamps) - min(stamps)).total_seconds() / 60 if len(stamps) > 1 else 0.0


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
