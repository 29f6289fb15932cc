"""`groupwise train <env>`: the main job. Trains a model on a built-in environment with `gw.fit`.

What it does, in order (each step printed as it happens):

1. builds the env's scenarios (train / val / test; val and test are the same held-out set for every seed);
2. registers a `TrainableModel` on a `LocalBackend` (resumes if the run folder has checkpoints);
3. picks the reward: the env's own (verifiable), or RULER (judge / hybrid envs). A judge named
   ``local/<the base model>`` reuses the engine that serves the rollouts, asking for ``<name>@0`` (the
   base weights, adapter off), so the machine holds one copy of the weights;
4. `gw.fit`: validation at step 0 (the untrained base) and every ``eval_every`` steps, GRPO steps, the
   stopping rules and reward-hacking detectors; the best checkpoint is evaluated on the test split;
5. prints validation before and after, the stop reason and the plot written by `groupwise report`.

The defaults come from the env's `EnvSpec`, sized for about 10 minutes on 2 CPU cores with SmolLM2-135M.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from groupwise.envs import EnvSpec, get_env


def _reward_step(spec: EnvSpec, judge: str | None, model: Any, base_model: str, gate_correct: bool = False):
    """The group step applied after gathering: None for verifiable envs, else a RULER call."""
    if spec.reward == "verifiable" and judge is None:
        return None
    from groupwise.judge import apply_hybrid, gate, ruler_score_group

    judge = judge or f"local/{base_model}"
    kwargs: dict[str, Any] = {}
    judge_model = judge
    if judge == f"local/{base_model}":
        # Same weights as the policy's base: ask the policy's own engine for the base (adapter off).
        kwargs["client"] = model.openai_client()
        judge_model = model.inference_name(0)
    elif judge.startswith("local/"):
        # Another local model: the backend serves it in process (the judge only receives a client).
        judge_model = judge.removeprefix("local/")
        kwargs["client"] = model.backend.judge_client(judge_model)
    rubric_kwargs = {"rubric": spec.rubric} if spec.rubric else {}

    async def reward(group):
        judged = await ruler_score_group(group, judge_model, swallow_exceptions=True, **rubric_kwargs, **kwargs)
        if judged is not None and gate_correct and spec.gate_metric:
            # Correctness gate: a wrong answer keeps at most the judge's floor (judge/hybrid.py says why).
            judged = apply_hybrid(judged, gate, verifiable_key=spec.gate_metric)
        return judged

    return reward


async def train(
    env: str,
    *,
    model_name: str = "smollm2-135m",
    judge: str | None = None,
    steps: int | None = None,
    seed: int = 0,
    path: str = ".groupwise",
    name: str | None = None,
    device: str | None = None,
    gate: bool = False,
    sft: int = 0,
    sft_epochs: int = 2,
    sft_lr: float = 2e-4,
) -> dict[str, Any]:
    """Run the main job; returns a JSON-able summary (also written to <run_dir>/summary.json)."""
    import groupwise as gw
    from groupwise.loop.report import load_run, plot_run

    spec = get_env(env)
    train_s, val_s, test_s = spec.scenarios(seed, max_tokens=spec.max_tokens)
    if spec.val_size is not None:
        val_s = val_s[: spec.val_size]
        test_s = test_s[: spec.val_size]
    name = name or f"{spec.name}-s{seed}"
    max_steps = steps if steps is not None else spec.steps
    metric = spec.val_metric or "reward"
    print(f"[groupwise train] env={spec.name} ({spec.description})")
    print(f"[groupwise train] model={model_name} steps<={max_steps} seed={seed} "
          f"groups/step={spec.groups_per_step} rollouts/group={spec.rollouts_per_group} "
          f"train/val/test={len(train_s)}/{len(val_s)}/{len(test_s)}")

    t0 = time.monotonic()
    model = gw.TrainableModel(name=name, project=spec.name, base_model=model_name, base_path=path)
    backend = gw.LocalBackend(path, device=device, best_checkpoint_metric=f"val/{metric}",
                              max_batch_size=max(32, spec.rollouts_per_group * spec.groups_per_step))
    await model.register(backend)
    print(f"[groupwise train] loaded {model_name} in {time.monotonic() - t0:.1f}s; run folder {model.run_dir}")
    sft_steps, baselines = 0, []
    if sft:
        # Supervised warm start (recipes/sft.py): its last step is scored as a baseline GRPO has to beat.
        from groupwise.loop.fit import AtStep
        from groupwise.recipes.sft import env_demonstrations, warm_start

        demos = env_demonstrations(spec, sft, seed=seed, max_tokens=spec.max_tokens)
        sft_steps = await warm_start(model, demos, epochs=sft_epochs, learning_rate=sft_lr, seed=seed)
        baselines = [AtStep(model, sft_steps)]
        max_steps += sft_steps  # --steps counts the GRPO steps

    config = gw.LoopConfig(
        rollouts_per_group=spec.rollouts_per_group,
        groups_per_step=spec.groups_per_step,
        max_steps=max_steps,
        num_epochs=100,  # the step budget, not the data, ends the job
        learning_rate=spec.learning_rate,
        # Tool-using transcripts (email) run to thousands of tokens: recompute layers in the backward pass
        # instead of holding their activations (measured: the email step was OOM-killed without it).
        train_config=gw.TrainConfig(learning_rate=spec.learning_rate, gradient_checkpointing=True,
                                    micro_batch_tokens=2048) if spec.reward != "verifiable" else None,
        eval_every=max(1, max_steps // 2),  # the base, the midpoint, the end
        metric=metric,
        patience=max(max_steps, 10),  # the job is short: let max_steps or the detectors end it
        seed=seed,
        max_exceptions=0.1,
    )
    try:
        summary = await gw.fit(
            model, spec.rollout, train_s,
            val_scenarios=val_s if spec.val_metric else None,
            test_scenarios=test_s if spec.val_metric else None,
            reward=_reward_step(spec, judge, model, model_name, gate),
            validate=spec.validate if spec.val_metric else None,
            baselines=baselines if spec.val_metric else (),
            config=config,
        )
    finally:
        await backend.close()
    wall = time.monotonic() - t0

    history = load_run(model.run_dir)
    plots = plot_run(history, Path(model.run_dir) / "report", title=f"{spec.name}/{name}")
    val_rows = [r for r in history if r.get("split") == "val" and r.get(metric) is not None]
    before = val_rows[0][metric] if val_rows else None
    after = summary.best_value
    result = {
        "env": spec.name, "model": model_name, "seed": seed, "run_dir": str(model.run_dir),
        "metric": f"val/{metric}", "base": before, "trained_best": after, "best_step": summary.best_step,
        "final_step": summary.final_step, "test": summary.test, "stop_reason": summary.stop_reason,
        "wall_s": round(wall, 1), "plots": [str(p) for p in plots],
        "alerts": [f"{a.name}@{a.step}" for a in summary.alerts],
        "sft_steps": sft_steps, "sft": summary.baselines.get(model.inference_name(sft_steps)) if sft_steps else None,
    }
    Path(model.run_dir, "summary.json").write_text(json.dumps(result, indent=2))
    print()
    print(summary)
    print(f"[groupwise train] validation {metric}: base {_fmt(before)} -> best {_fmt(after)} "
          f"(step {summary.best_step}); wall {wall / 60:.1f} min")
    print(f"[groupwise train] stop reason: {summary.stop_reason}")
    for p in plots:
        print(f"[groupwise train] plot: {p}")
    return result


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def run_train(args: Any) -> int:
    """Entry point of `groupwise train` (arguments declared in cli.py)."""
    try:
        get_env(args.env)
    except KeyError as exc:
        print(f"groupwise train: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.judge and not args.judge.startswith("local/"):  # a missing key or bad name, before loading
        from groupwise.errors import JudgeError
        from groupwise.judge.providers import resolve

        try:
            resolve(args.judge)
        except JudgeError as exc:
            print(f"groupwise train: error: --judge {args.judge}: {exc}", file=sys.stderr)
            return 2
    asyncio.run(train(args.env, model_name=args.model, judge=args.judge, steps=args.steps, seed=args.seed,
                      path=args.path, name=args.name, device=getattr(args, "device", None),
                      gate=getattr(args, "gate", False), sft=getattr(args, "sft", 0),
                      sft_epochs=getattr(args, "sft_epochs", 2), sft_lr=getattr(args, "sft_lr", 2e-4)))
    return 0
