"""`groupwise train <env>`: the main job. Trains a model on a built-in environment with `gw.fit`.

What it does, in order:

1. builds the env's scenarios (train / val / test; val and test are the same held-out set for every seed);
2. registers a `TrainableModel` on a `LocalBackend`; a run folder with checkpoints is resumed, so the
   same command with a larger ``--steps`` trains an existing run further;
3. picks the reward: the env's own (verifiable), or RULER (judge / hybrid envs). A judge named
   ``local/<the base model>`` reuses the engine that serves the rollouts, asking for ``<name>@0`` (the
   base weights, adapter off), so the machine holds one copy of the weights;
4. `gw.fit`: validation at step 0 (the untrained base) and every ``eval_every`` steps, GRPO steps, the
   stopping rules and detectors; the best checkpoint is evaluated on the test split. One line per step
   (reward, seconds of rollouts / judge / update, validation with its interval, ETA), a progress bar
   during each update, each alert once when raised;
5. prints the base and the best validation with their intervals, the test, the stop reason once, what
   to do next, and writes the plots of `groupwise report` and ``summary.json``.

The defaults come from the env's `EnvSpec`, sized for about 10 minutes on 2 CPU cores with SmolLM2-135M.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from groupwise.envs import EnvSpec, get_env
from groupwise.loop.series import points
from groupwise.loop.stopping import significant_gap


def _train_config(spec: EnvSpec, device: str | None) -> Any:
    """The GRPO step settings of the job.

    Tool-using transcripts (email) run to thousands of tokens: recompute layers in the backward pass
    instead of holding their activations, which would not fit a small machine. Otherwise, on the CPU,
    micro-batches of 512 tokens: an fp32 SmolLM2 holds ~1.5 MB of activations per token for the
    backward, so a 4096-token micro-batch alone takes ~6 GB; 512 tokens give the same gradient (the
    loss normalises over the whole step) and keep the whole 2048 job under 4 GB, for a slightly
    slower update than 1024 (docs/benchmarks.md, the main job).
    """
    import groupwise as gw
    from groupwise.loading import resolve_device

    if spec.reward != "verifiable":
        return gw.TrainConfig(learning_rate=spec.learning_rate, gradient_checkpointing=True, micro_batch_tokens=2048)
    if resolve_device(device).type == "cpu":
        return gw.TrainConfig(learning_rate=spec.learning_rate, micro_batch_tokens=512)
    return gw.TrainConfig(learning_rate=spec.learning_rate)


def _judge_target(judge: str, model: Any, base_model: str) -> tuple[str, dict[str, Any]]:
    """(the model name RULER sends, its keyword arguments) of a `--judge` name."""
    if judge == f"local/{base_model}":
        # Same weights as the policy's base: ask the policy's own engine for the base (adapter off).
        return model.inference_name(0), {"client": model.openai_client()}
    if judge.startswith("local/"):
        # Another local model: the backend serves it in process (the judge only receives a client).
        name = judge.removeprefix("local/")
        return name, {"client": model.backend.judge_client(name)}
    return judge, {}


async def _select_judge(spec: EnvSpec, judges: list[str], labels: str, model: Any, base_model: str,
                        margin: float) -> str:
    """The `--judge` candidate to train with, chosen on the labelled set `labels` before training:
    the best one whose pairwise accuracy clears chance by `margin` at its lower bound; else
    `JudgeSelectionError` with the table (training would learn noise)."""
    from groupwise.judge import DEFAULT_RUBRIC, JudgeSpec, select_judge
    from groupwise.judge.eval_command import load_labels

    labelled, rubric = load_labels(spec.name if labels == "env" else labels)
    rubric = spec.rubric or rubric or DEFAULT_RUBRIC
    specs = []
    for j in judges:
        judge_model, kwargs = _judge_target(j, model, base_model)
        specs.append(JudgeSpec(judge_model, rubric=rubric, name=j, client=kwargs.get("client")))
    chosen, _, table = await select_judge(labelled, specs, margin=margin, repeats=1)
    print(f"[groupwise train] judge check on {len(labelled)} labelled groups ({labels}):\n{table}")
    print(f"[groupwise train] judging with {chosen.label}")
    return chosen.label


def _score_group(spec: EnvSpec, judge: str | None, model: Any, base_model: str, gate_correct: bool = False):
    """fit's score_group: None for verifiable envs, else a RULER call (gated by correctness for hybrid)."""
    if spec.reward == "verifiable" and judge is None:
        return None
    from groupwise.judge import apply_hybrid, gate, ruler_score_group

    judge_model, kwargs = _judge_target(judge or f"local/{base_model}", model, base_model)
    rubric_kwargs = {"rubric": spec.rubric} if spec.rubric else {}

    async def score_group(group):
        judged = await ruler_score_group(group, judge_model, swallow_exceptions=True, **rubric_kwargs, **kwargs)
        if judged is not None and gate_correct and spec.gate_metric:
            # Correctness gate: a wrong answer keeps at most the judge's floor (judge/hybrid.py says why).
            judged = apply_hybrid(judged, gate, verifiable_key=spec.gate_metric)
        return judged

    return score_group


async def train(
    env: str,
    *,
    model_name: str = "smollm2-135m",
    judge: str | list[str] | None = None,
    judge_labels: str | None = None,
    judge_margin: float = 0.05,
    steps: int | None = None,
    seed: int = 0,
    path: str = ".groupwise",
    name: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    learning_rate: float | None = None,
    gate: bool = False,
    sft: int = 0,
    sft_epochs: int = 2,
    sft_lr: float = 2e-4,
    batch_invariant: bool = False,
) -> dict[str, Any]:
    """Run the main job; returns a JSON-able summary (also written to <run_dir>/summary.json).

    `judge` may list several candidates; with `judge_labels` (an env with a labelled set, ``env`` for
    this one's, a JSONL file or a run folder) they are evaluated before training and the best one that
    clears `judge_margin` is used, or the job stops with the table (`JudgeSelectionError`)."""
    import groupwise as gw
    from groupwise.loop.report import load_run, plot_run

    spec = get_env(env)
    if learning_rate is not None:
        spec = dataclasses.replace(spec, learning_rate=learning_rate)
    train_s, val_s, test_s = spec.scenarios(seed, max_tokens=spec.max_tokens)
    if spec.val_size is not None:
        val_s = val_s[: spec.val_size]
        test_s = test_s[: spec.val_size]
    name = name or f"{spec.name}-s{seed}"
    max_steps = steps if steps is not None else spec.steps
    metric = spec.val_metric or "reward"
    print(f"[groupwise train] env={spec.name} ({spec.description})")
    print(f"[groupwise train] model={model_name} steps<={max_steps} seed={seed} "
          f"groups/step={spec.groups_per_step} rollouts/group={spec.rollouts_per_group} lr={spec.learning_rate:g} "
          f"train/val/test={len(train_s)}/{len(val_s)}/{len(test_s)}")
    print(f"[groupwise train] watch it live: groupwise dashboard {shlex.quote(str(path))}")

    t0 = time.monotonic()
    model = gw.TrainableModel(name=name, project=spec.name, base_model=model_name, base_path=path)
    backend = gw.LocalBackend(path, device=device, dtype=dtype, best_checkpoint_metric=f"val/{metric}",
                              max_batch_size=max(32, spec.rollouts_per_group * spec.groups_per_step),
                              engine_kwargs={"batch_invariant": True} if batch_invariant else None)
    await model.register(backend)
    load_s = time.monotonic() - t0
    resumed = await model.get_step()
    print(f"[groupwise train] loaded {model_name} in {load_s:.1f}s; run folder {model.run_dir}"
          + (f" (resuming at step {resumed})" if resumed else ""))
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
        train_config=_train_config(spec, device),
        eval_every=max(1, max_steps // 2),  # the base, the midpoint, the end
        # An env without a validation metric (titles) runs no validation; the loop's metric is then unused,
        # and "reward" would clash with the history row's own reward field.
        **({"metric": metric} if spec.val_metric else {}),
        patience=max(max_steps, 10),  # the job is short: let max_steps or the detectors end it
        seed=seed,
        max_exceptions=0.1,
    )
    judges = [judge] if isinstance(judge, str) else list(judge or [])
    if len(judges) > 1 and not judge_labels:
        raise gw.ConfigError(f"{len(judges)} judges given ({', '.join(judges)}) but no labelled set to choose "
                             "between them: pass --judge-labels (an env with a labelled set such as titles, "
                             "'env', a JSONL file, or a run folder)", what="train arguments")
    try:
        if judge_labels:
            candidates = judges or [f"local/{model_name}"]
            judges = [await _select_judge(spec, candidates, judge_labels, model, model_name, judge_margin)]
        summary = await gw.fit(
            model, spec.rollout, train_s,
            val_scenarios=val_s if spec.val_metric else None,
            test_scenarios=test_s if spec.val_metric else None,
            score_group=_score_group(spec, judges[0] if judges else None, model, model_name, gate),
            validate=spec.validate if spec.val_metric else None,
            baselines=baselines if spec.val_metric else (),
            config=config,
        )
    finally:
        await backend.close()
    wall = time.monotonic() - t0

    history = load_run(model.run_dir)
    plots = plot_run(history, Path(model.run_dir) / "report", title=f"{spec.name}/{name}")
    base = next((p for p in points(history, "val", metric) if p.step == 0), None)
    best = next((p for p in points(history, "val", metric) if p.step == summary.best_step), None)
    result = {
        "env": spec.name, "model": model_name, "seed": seed, "run_dir": str(model.run_dir),
        "learning_rate": spec.learning_rate,
        "metric": f"val/{metric}", "base": base.value if base else None,
        "base_interval": [base.lo, base.hi] if base else None,
        "trained_best": summary.best_value, "best_interval": [best.lo, best.hi] if best else None,
        "best_step": summary.best_step, "final_step": summary.final_step, "test": summary.test,
        "stop_rule": summary.stop.rule, "stop_reason": summary.stop_reason, "status": summary.status,
        "wall_s": round(wall, 1), "load_s": round(load_s, 1), "peak_rss_gb": round(peak_rss_gb(), 2),
        "plots": [str(p) for p in plots], "alerts": [f"{a.name}@{a.step}" for a in summary.alerts],
        "sft_steps": sft_steps, "sft": summary.baselines.get(model.inference_name(sft_steps)) if sft_steps else None,
    }
    Path(model.run_dir, "summary.json").write_text(json.dumps(result, indent=2))
    say = lambda text: print(f"[groupwise train] {text}")  # noqa: E731
    print()
    say(f"done in {wall / 60:.1f} min (model load {load_s:.0f}s), peak memory {result['peak_rss_gb']:.1f} GB")
    if base is not None:
        say(f"validation {metric}: base {_with_ci(base)} -> best {_with_ci(best)} at step {summary.best_step}")
    if summary.test:
        t = summary.test
        ci = f" [{t[f'{metric}_lo']:.3f}, {t[f'{metric}_hi']:.3f}]" if f"{metric}_lo" in t else ""
        shown = f"{metric} {t[metric]:.3f}{ci}" if metric in t else f"reward {t['reward']:.3f}"
        say(f"test ({len(test_s)} held-out scenarios, checkpoint of step {summary.best_step}): {shown}")
    rule = summary.stop.rule  # the loop printed the stop reason once, when it stopped
    for line in advice(base, best, summary.final_step, rule, env=spec.name, seed=seed, steps=max_steps - sft_steps,
                       run_dir=str(model.run_dir)):
        say(line)
    return result


def peak_rss_gb() -> float:
    """This process's peak resident memory in GB (Linux reports KB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def _with_ci(p: Any) -> str:
    if p is None:
        return "n/a"
    return f"{p.value:.3f}" if p.lo is None else f"{p.value:.3f} [{p.lo:.3f}, {p.hi:.3f}]"


def advice(base: Any, best: Any, final_step: int, rule: str, *, env: str, seed: int, steps: int,
           run_dir: str) -> list[str]:
    """What the user of `groupwise train` can do next, given how the run went."""
    again = f"groupwise train {env} --seed {seed}"
    more = f"`{again} --steps {max(2 * steps, final_step + 4)}` continues this run from step {final_step}"
    watch = f"curves: `groupwise report {run_dir}`; answers: `groupwise compare {run_dir} --steps 0,best`"
    learned = (base is not None and best is not None and best.step != base.step
               and significant_gap(best, base))
    if rule == "alert:val_drop":
        return [f"the env's reward rose while validation fell: read what the reward liked "
                f"(`groupwise inspect {run_dir} --split train --best`). A built-in env's reward is fixed, so "
                f"try another seed (`groupwise train {env} --seed {seed + 1}`); for your own env, fix its "
                f"reward and train with gw.fit.", watch]
    if rule == "alert:val_unstable":
        return [f"validation fell beyond its noise without the reward being gamed: an unlucky or too large "
                f"step. Try another seed (`groupwise train {env} --seed {seed + 1}`); the best checkpoint "
                f"(step {best.step if best else 0}) is kept.", watch]
    if learned:
        return [f"it learned (the gain is larger than the validation noise). To train longer: {more}.", watch]
    if best is not None:
        return [f"validation did not rise beyond its noise. Try more steps ({more}) or another seed "
                f"(`groupwise train {env} --seed {seed + 1}`).", watch]
    return [watch]


def _show_progress() -> None:
    """Print the loop's per-step lines and alerts (logger ``groupwise.loop``) on stdout, once each."""
    import logging

    logger = logging.getLogger("groupwise.loop")
    if any(getattr(h, "_groupwise_train", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[groupwise train] %(message)s"))
    handler._groupwise_train = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def run_train(args: Any) -> int:
    """Entry point of `groupwise train` (arguments declared in cli.py)."""
    try:
        get_env(args.env)
    except KeyError as exc:
        print(f"groupwise train: {exc.args[0]}", file=sys.stderr)
        return 2
    judges = [args.judge] if isinstance(args.judge, str) else list(args.judge or [])
    if len(judges) > 1 and not getattr(args, "judge_labels", None):
        print(f"groupwise train: error: {len(judges)} --judge candidates need --judge-labels to choose between "
              "them (titles, 'env', a JSONL file or a run folder)", file=sys.stderr)
        return 2
    for judge in judges:
        if judge.startswith("local/"):
            continue
        from groupwise.errors import JudgeError
        from groupwise.judge.providers import resolve

        try:  # a missing key or bad name, before loading
            resolve(judge)
        except JudgeError as exc:
            print(f"groupwise train: error: --judge {judge}: {exc}", file=sys.stderr)
            return 2
    _show_progress()
    asyncio.run(train(args.env, model_name=args.model, judge=judges or None, steps=args.steps, seed=args.seed,
                      judge_labels=getattr(args, "judge_labels", None), judge_margin=getattr(args, "judge_margin", 0.05),
                      path=args.path, name=args.name, device=getattr(args, "device", None),
                      dtype=getattr(args, "dtype", None), learning_rate=getattr(args, "lr", None),
                      gate=getattr(args, "gate", False), sft=getattr(args, "sft", 0),
                      sft_epochs=getattr(args, "sft_epochs", 2), sft_lr=getattr(args, "sft_lr", 2e-4),
                      batch_invariant=getattr(args, "batch_invariant", False)))
    return 0
