"""What one run of `groupwise train` is made of: its backend, its loop and step settings, its reward step.

The train job (jobs/train.py) builds one run from these; a sweep (jobs/train_sweep.py) builds several on
one backend from the same parts, so a run of a sweep is the run the single job would train.
"""

from __future__ import annotations

import sys
from typing import Any

from groupwise.config import CPU_MICRO_BATCH_TOKENS, DEFAULT_MAX_BATCH_SIZE

__all__ = ["judge_target", "job_backend", "loop_config", "peak_rss_gb", "score_group_of", "train_config", "with_ci"]


def job_backend(job: Any, preset: Any, runs: int = 1) -> Any:
    """The job's `LocalBackend`: its engine batches every rollout of a step of each of `runs` runs at once,
    in a core process of its own when the job's engine_process ("auto" by default) picks it for `runs`."""
    import groupwise as gw
    from groupwise.backend.local import engine_process_for

    metric = metric_of(job.env)
    engine_process = job.engine_process
    if runs > 1:  # one run keeps the backend's own "auto" (in process)
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


def judge_target(judge: str, model: Any, base_model: str) -> tuple[str, dict[str, Any]]:
    """(the model name RULER sends, its keyword arguments) of a `--judge` name."""
    if judge == f"local/{base_model}":
        # Same weights as the policy's base: ask the policy's own engine for the base (adapter off).
        return model.inference_name(0), {"client": model.openai_client()}
    if judge.startswith("local/"):
        # Another local model: the backend serves it in process (the judge only receives a client).
        name = judge.removeprefix("local/")
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
