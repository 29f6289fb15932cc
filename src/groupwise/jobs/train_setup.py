"""What one run of `groupwise train` is made of: its backend, its loop and step settings, its reward step.

The train job (jobs/train.py) builds one run from these; a sweep (jobs/train_sweep.py) builds several on
one backend from the same parts (`new_model`, `prepare`, `run_row`: in the sweep's process or in each
run's own, jobs/train_processes.py), so a run of a sweep is the run the single job would train.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from groupwise.config import CPU_MICRO_BATCH_TOKENS, DEFAULT_MAX_BATCH_SIZE

__all__ = ["judge_target", "job_backend", "local_judge_model", "loop_config", "new_model", "peak_rss_gb", "prepare", "run_minutes", "run_name",
           "run_row", "score_group_of", "show_progress", "train_config", "with_ci"]


def job_backend(job: Any, preset: Any, runs: int = 1, *, separate: bool = False, join: str | None = None) -> Any:
    """The job's `LocalBackend`: its engine batches every rollout of a step of each of `runs` runs at once,
    in a core process of its own when the job's engine_process ("auto" by default) picks it for `runs`, or
    when `separate` (a sweep whose runs' processes share it). `join`: the backend of one such run's
    process, on the worker at that address (the worker's settings are the sharing backend's)."""
    import groupwise as gw
    from groupwise.backend.local import engine_process_for

    metric = metric_of(job.env)
    if join is not None:
        return gw.LocalBackend(job.path, best_checkpoint_metric=f"val/{metric}", join=join)
    engine_process = job.engine_process
    if separate:
        engine_process = "separate"
    elif runs > 1:  # one run keeps the backend's own "auto" (in process)
        from groupwise.runtime.loading import resolve_device

        engine_process = engine_process_for(job.engine_process, runs=runs, device_type=resolve_device(job.device).type)
    return gw.LocalBackend(job.path, device=job.device, dtype=job.dtype, best_checkpoint_metric=f"val/{metric}",
                           max_batch_size=max(DEFAULT_MAX_BATCH_SIZE,
                                              runs * preset.rollouts_per_group * preset.groups_per_step),
                           engine_kwargs={"batch_invariant": True} if job.batch_invariant else None,
                           engine_process=engine_process)


def metric_of(env: str) -> str:
    """The env's validation metric (\"reward\" for an env without one)."""
    from groupwise.envs import get_env

    return get_env(env).val_metric or "reward"


def loop_config(spec: Any, preset: Any, max_steps: int, seed: int, device: str | None, *,
                distill_top_k: int | None = None) -> Any:
    """The loop settings of one run of the job (`distill_top_k`: the job's --distill-top-k)."""
    import groupwise as gw

    return gw.LoopConfig(
        rollouts_per_group=preset.rollouts_per_group,
        groups_per_step=preset.groups_per_step,
        max_steps=max_steps,
        num_epochs=100,  # the step budget, not the data, ends the job
        # it owns the learning rate
        train_config=train_config(spec, preset.learning_rate, device, distill_top_k, num_iterations=preset.num_iterations),
        eval_every=max(1, max_steps // 2),  # the base, the midpoint, the end
        # An env without a validation metric (titles) runs no validation; the loop's metric is then unused,
        # and "reward" would clash with the history row's own reward field.
        **({"metric": spec.val_metric} if spec.val_metric else {}),
        patience=max(max_steps, 10),  # the job is short: let max_steps or the detectors end it
        seed=seed,
        max_exceptions=0.1,
    )


def train_config(spec: Any, learning_rate: float, device: str | None, distill_top_k: int | None = None, *,
                 num_iterations: int | None = None) -> Any:
    """The GRPO step settings of the job.

    Tool-using transcripts (email) run to thousands of tokens: recompute layers in the backward pass
    instead of holding their activations, which would not fit a small machine. Otherwise, on the CPU,
    micro-batches of 512 tokens: an fp32 SmolLM2 holds ~1.5 MB of activations per token for the
    backward, so a 4096-token micro-batch alone takes ~6 GB; 512 tokens give the same gradient (the
    loss normalises over the whole step) and keep the whole 2048 job under 4 GB, for a slightly
    slower update than 1024 (docs/benchmarks.md, the main job). `distill_top_k`: distil with the top-k
    estimate of that k (TrainConfig.distill_estimate); None keeps the default, the sampled-token one.
    """
    import groupwise as gw
    from groupwise.runtime.loading import resolve_device

    given: dict[str, Any] = {} if num_iterations is None else {"num_iterations": num_iterations}  # None: TrainConfig's
    if distill_top_k is not None:
        given.update(distill_estimate="topk", distill_top_k=distill_top_k)
    if spec.reward != "verifiable":
        return gw.TrainConfig(learning_rate=learning_rate, gradient_checkpointing=True, micro_batch_tokens=2048, **given)
    if resolve_device(device).type == "cpu":
        return gw.TrainConfig(learning_rate=learning_rate, micro_batch_tokens=CPU_MICRO_BATCH_TOKENS, **given)
    return gw.TrainConfig(learning_rate=learning_rate, **given)


def local_judge_model(judge: str, base_model: str) -> str | None:
    """The model a ``--judge local/<model>`` loads beside the base, served by the backend of the process that
    asks (`LocalBackend.judge_client`); None for the base itself (the policy's engine, adapter off) or a
    remote judge."""
    if not judge.startswith("local/") or judge == f"local/{base_model}":
        return None
    return judge.removeprefix("local/")


def judge_target(judge: str, model: Any, base_model: str) -> tuple[str, dict[str, Any]]:
    """(the model name RULER sends, its keyword arguments) of a `--judge` name."""
    if judge == f"local/{base_model}":
        # Same weights as the policy's base: ask the policy's own engine for the base (adapter off).
        return model.inference_name(0), {"client": model.openai_client()}
    name = local_judge_model(judge, base_model)
    if name is not None:
        # Another local model: the backend serves it in process (the judge only receives a client).
        return name, {"client": model.backend.judge_client(name)}
    return judge, {}


def score_group_of(spec: Any, judge: str | None, model: Any, base_model: str, gate_correct: bool = False):
    """fit's score_group: None for verifiable envs, else a RULER call (gated by correctness for hybrid)."""
    if spec.reward == "verifiable" and judge is None:
        return None
    from groupwise.judge import apply_hybrid, gate, ruler_score_group

    judge_model, kwargs = judge_target(judge or f"local/{base_model}", model, base_model)
    rubric_kwargs = {"rubric": spec.rubric} if spec.rubric else {}

    async def score_group(group):
        judged = await ruler_score_group(group, judge_model, swallow_exceptions=True, **rubric_kwargs, **kwargs)
        if judged is not None and gate_correct and spec.gate_metric:
            # Correctness gate: a wrong answer keeps at most the judge's floor (judge/hybrid.py says why).
            judged = apply_hybrid(judged, gate, verifiable_key=spec.gate_metric)
        return judged

    return score_group


def show_progress() -> None:
    """Print the loop's per-step lines and alerts (logger ``groupwise.loop``) on stdout, once each (the job's
    process, and each run's process of a sweep that drives its runs so: jobs/train_processes.py)."""
    import logging

    logger = logging.getLogger("groupwise.loop")
    if any(getattr(h, "_groupwise_train", False) for h in logger.handlers):
        return
    from tqdm import tqdm

    class Stdout(logging.StreamHandler):  # the stdout of the moment (a redirect made after this one), not the first
        stream = property(lambda self: sys.stdout, lambda self, value: None)

        def emit(self, record: logging.LogRecord) -> None:
            # The rollout bars (stderr) stop mid-line; a step line printed then would follow a bar on the
            # same terminal line. tqdm clears its bars around the write and draws them again after.
            with tqdm.external_write_mode(file=sys.stdout):
                super().emit(record)

    handler = Stdout()
    handler.setFormatter(logging.Formatter("[groupwise train] %(message)s"))
    handler._groupwise_train = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def run_name(env: str, seed: int, lr: float | None, rates: int) -> str:
    """``<env>-s<seed>``, with ``-lr<rate>`` when the sweep has several rates (the single run's name otherwise)."""
    return f"{env}-s{seed}" + (f"-lr{lr:g}" if rates > 1 and lr is not None else "")


def new_model(job: Any, spec: Any, seed: int, lr: float | None) -> Any:
    """The `TrainableModel` of the sweep's run of (`seed`, `lr`), not yet registered."""
    import groupwise as gw

    return gw.TrainableModel(name=run_name(spec.name, seed, lr, len(job.lr or [None])), project=job.project_of(),
                             base_model=job.model, base_path=job.path)


async def prepare(job: Any, spec: Any, model: Any, seed: int, preset: Any, backend: Any) -> tuple[Any, int]:
    """Register `model` on `backend`, warm-start it when the preset or ``--sft`` asks; (its `gw.FitRun`, its
    SFT steps). The run is the one the single job would train."""
    import groupwise as gw
    from groupwise.jobs.sft import warm_started

    train_s, val_s, test_s = spec.scenarios(seed)
    if preset.val_size is not None:
        val_s, test_s = val_s[: preset.val_size], test_s[: preset.val_size]
    await model.register(backend)
    sft_steps, baselines = await warm_started(spec, preset.sft, model, seed=seed, epochs=job.sft_epochs,
                                              learning_rate=job.sft_lr)
    judge = (job.judge or [None])[0]
    plan = gw.FitRun(
        model, spec.rollout, train_s,
        val_scenarios=val_s if spec.val_metric else None,
        test_scenarios=test_s if spec.val_metric else None,
        score_group=score_group_of(spec, judge, model, job.model, job.gate),
        validate=spec.validate if spec.val_metric else None,
        baselines=baselines if spec.val_metric else (),
        config=loop_config(spec, preset, preset.steps + sft_steps, seed, job.device, distill_top_k=job.distill_top_k),
        teacher=job.teacher)
    return plan, sft_steps


def run_row(model: Any, seed: int, preset: Any, sft_steps: int, result: Any, metric: str) -> dict[str, Any]:
    """A run's row of the final table, from its history and its result (a `FitSummary`, or the exception
    that ended it); a finished run's is also its summary.json. ``_points``: the (base, best) validation points."""
    import groupwise as gw
    from groupwise.jobs.sft import warm_start_fields
    from groupwise.runs.series import points

    history = gw.load_history(model.run_dir)  # [] for a run that failed before its first row
    base = next((p for p in points(history, "val", metric) if p.step == 0), None)
    row: dict[str, Any] = {"run": model.name, "seed": seed, "learning_rate": preset.learning_rate,
                           "run_dir": str(model.run_dir), "base": base.value if base else None,
                           "base_interval": [base.lo, base.hi] if base else None,
                           "minutes": round(run_minutes(history), 2)}
    best = None
    if isinstance(result, BaseException):
        row.update(error=f"{type(result).__name__}: {' '.join(str(result).split())[:300]}")
    else:
        best = next((p for p in points(history, "val", metric) if p.step == result.best_step), None)
        row.update(best=result.best_value, best_interval=[best.lo, best.hi] if best else None,
                   best_step=result.best_step, final_step=result.final_step, test=result.test,
                   stop_rule=result.stop.rule, **warm_start_fields(model, sft_steps, result.baselines))
        Path(model.run_dir, "summary.json").write_text(json.dumps(row, indent=2))
    row["_points"] = (base, best)
    return row


def run_minutes(history: list[dict[str, Any]]) -> float:
    """The run's minutes, from its first history row to its last (all runs share the wall clock)."""
    from datetime import datetime

    stamps = [datetime.fromisoformat(r["recorded_at"]) for r in history if isinstance(r.get("recorded_at"), str)]
    return (max(stamps) - min(stamps)).total_seconds() / 60 if len(stamps) > 1 else 0.0


def peak_rss_gb() -> float:
    """Peak resident memory in GB of this process plus the largest of its children that have ended (Linux
    reports KB, macOS bytes). Read after the backend closed, the child is its engine's worker process
    (`--engine-process separate`, or `devices`), which holds the model: this process alone would report
    the rollouts' share. The two peaks summed bound what both held at once from above."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def with_ci(p: Any) -> str:
    if p is None:
        return "n/a"
    return f"{p.value:.3f}" if p.lo is None else f"{p.value:.3f} [{p.lo:.3f}, {p.hi:.3f}]"
