"""The email agent learns: base vs SFT warm start vs SFT + GRPO, on held-out questions.

Per seed, on one SmolLM2-135M (CPU by default):

1. held-out accuracy of the untrained base (``name@0``) on the 48 questions no run trains on (the env's
   validation and test splits together), greedy (temperature 0), so each number is one deterministic pass;
2. SFT warm start: `--demos` demonstrations of the scripted agent (search with the question's key
   words, read the source email, answer with the ground truth), `--epochs` epochs, one step each;
   the same held-out measurement at its last step (SFT-only);
3. GRPO from there with `gw.fit` for `--steps` steps on the training questions, with a hybrid reward:
   the env's tiered ground-truth reward (correct 1.1, "I don't know" 0, wrong -1, plus credit for
   finding and reading the source) weighted 0.8, the RULER judge's score (0..1) weighted 0.2; the
   tiers are >= 0.8 apart, so the judge only orders trajectories within a tier. Advantages are
   reward - group mean (Dr. GRPO, `scale_rewards=False`) by default: dividing by the group's std would
   blow the judge's small within-tier differences up to full-size advantages in every group the ground
   truth calls a tie, and a 135M judge's ordering there is noise;
4. the same held-out measurement at the final step (SFT + RL; no checkpoint is picked on held-out data).

The judge is `local/<base>` (the policy's base weights through the same engine, the only judge that runs
here without an outside model); its agreement with ground truth is reported: over pairs of rollouts of
one group whose correctness differs, the share it scored the correct one higher.

Writes ``<path>/<project>/<name>/email_warm_start.json`` and prints one line per phase.

The defaults are the setting docs/benchmarks.md reports (tools called as text, 64 demonstrations for 2
epochs at lr 3e-4, then 8 GRPO steps of 8 questions x 8 rollouts at lr 1e-4 and temperature 0.7). GRPO
starts with fresh Adam moments (the trainer resets them when the objective changes).

Run:  python bench/email_warm_start.py --device cuda --seed 0 [--eval-every 3 --tool-mode native]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import groupwise as gw
from groupwise.envs import get_env
from groupwise.judge import apply_hybrid, judge_stats, ruler_score_group, weighted
from groupwise.loop.rollout_inputs import AtStep
from groupwise.runs.series import series
from groupwise.jobs.sft import env_demonstrations, warm_start


def held_out(spec: Any, n: int | None, **overrides: Any) -> list[Any]:
    """The env's validation and test questions (no run trains on them), answered greedily."""
    _, val, test = spec.scenarios(0, **{"temperature": 0.0, **overrides})
    return (val + test)[:n]


async def accuracy(model: Any, step: int, scenarios: list[Any], spec: Any, desc: str) -> dict[str, float]:
    t0 = time.monotonic()
    at = AtStep(model, step)
    groups = await gw.gather_trajectory_groups(
        [gw.TrajectoryGroup([spec.rollout(at, s)]) for s in scenarios], pbar_desc=desc, max_exceptions=0.1)
    trajs = [t for g in groups for t in g.trajectories]
    await model.log(groups, split=f"heldout-{desc}", step=step)
    mean = lambda k: statistics.fmean(float(t.metrics.get(k, 0.0)) for t in trajs)  # noqa: E731
    return {"accuracy": sum(t.metrics["correct"] for t in trajs) / len(scenarios), "n": len(scenarios),
            "answered": mean("answered"), "found_source": mean("found_source"), "read_source": mean("read_source"),
            "cited_source": mean("cited_source"), "tool_errors": mean("tool_errors"),
            "seconds": round(time.monotonic() - t0, 1)}


def judge_agreement(groups: list[Any]) -> tuple[int, int]:
    """(pairs where the judge scored the correct rollout above the wrong one, pairs with differing correctness)."""
    agree = total = 0
    for g in groups:
        ts = g.trajectories
        for i in range(len(ts)):
            for j in range(len(ts)):
                ci, cj = ts[i].metrics.get("correct", 0.0), ts[j].metrics.get("correct", 0.0)
                if ci > cj:
                    total += 1
                    agree += ts[i].metrics.get("ruler_score", 0.0) > ts[j].metrics.get("ruler_score", 0.0)
    return agree, total


async def main(args: argparse.Namespace) -> dict[str, Any]:
    spec = get_env("email")
    mode = {"tool_mode": args.tool_mode}
    heldout = held_out(spec, args.heldout, **mode)
    name = args.name or f"email-warm-s{args.seed}"
    t0 = time.monotonic()
    model = gw.TrainableModel(name=name, project="email", base_model=args.model, base_path=args.path)
    backend = gw.LocalBackend(args.path, device=args.device, best_checkpoint_metric=None, served_steps=3,
                              max_batch_size=max(32, len(heldout)))
    await model.register(backend)
    if (existing := await model.get_step()) > 0:  # a second run under one name would report the first one's steps
        await backend.close()
        raise SystemExit(f"{model.run_dir} already holds a run (step {existing}): pass another --name or --path, "
                         "or delete that folder")
    out: dict[str, Any] = {"seed": args.seed, "model": args.model, "demos": args.demos, "epochs": args.epochs,
                           "steps": args.steps, "heldout": len(heldout), "sft_lr": args.sft_lr, "rl_lr": args.rl_lr,
                           "tool_mode": args.tool_mode, "rollouts": args.rollouts, "groups": args.groups,
                           "temperature": args.temperature, "judge": args.judge, "scale_rewards": args.scale_rewards,
                           "normalize": args.normalize, "kl_coef": args.kl_coef}
    say = lambda text: print(f"[email-warm-start s{args.seed} {time.monotonic() - t0:6.0f}s] {text}", flush=True)  # noqa: E731
    judge_pairs = [0, 0]
    result = Path(model.run_dir, "email_warm_start.json")
    save = lambda: result.write_text(json.dumps(out, indent=2))  # noqa: E731  after each phase: a timeout keeps the rest
    try:
        say(f"loaded; held-out questions: {len(heldout)}")
        out["base"] = await accuracy(model, 0, heldout, spec, "base")
        say(f"base accuracy {out['base']['accuracy']:.3f} ({out['base']['seconds']}s)")
        save()

        t = time.monotonic()
        demos = env_demonstrations(spec, args.demos, seed=args.seed, **mode)
        sft_steps = await warm_start(model, demos, epochs=args.epochs, learning_rate=args.sft_lr,
                                     batch_size=args.batch_size, seed=args.seed, gradient_checkpointing=False)
        out["sft_seconds"] = round(time.monotonic() - t, 1)
        out["sft"] = await accuracy(model, sft_steps, heldout, spec, "sft")
        say(f"SFT ({sft_steps} steps, {out['sft_seconds']}s): accuracy {out['sft']['accuracy']:.3f}")
        save()

        judge_client, judge_model = model.openai_client(), model.inference_name(0)

        async def hybrid(group):
            # The local judge's default answer bound (96 tokens a trajectory) fits its 80-character
            # explanations; one retry: each try costs a full answer, and a third rarely parses.
            judged = await ruler_score_group(group, judge_model, rubric=spec.rubric, swallow_exceptions=True,
                                             client=judge_client, retries=1)
            if judged is None:  # the judge failed: the ground-truth reward alone
                return group
            a, n = judge_agreement([judged])
            judge_pairs[0] += a
            judge_pairs[1] += n
            return apply_hybrid(judged, weighted, weight=0.8)

        t = time.monotonic()
        config = gw.LoopConfig(
            rollouts_per_group=args.rollouts, groups_per_step=args.groups, max_steps=sft_steps + args.steps,
            num_epochs=100, seed=args.seed, patience=1000, max_exceptions=0.1,
            train_config=gw.TrainConfig(learning_rate=args.rl_lr, micro_batch_tokens=2048, max_seq_len=4096,
                                        scale_rewards=args.scale_rewards, normalize=args.normalize,
                                        kl_coef=args.kl_coef, kl_reference_step=sft_steps if args.kl_coef else None),
            metric="accuracy", eval_every=args.eval_every or 10_000,
            # the held-out curve is a measurement here, never a reason to stop or to pick a checkpoint
            on_val_drop="warn", on_val_unstable="warn", on_val_plateau="warn")
        train = spec.scenarios(args.seed, temperature=args.temperature, **mode)[0]
        curve = {"val_scenarios": heldout, "validate": spec.validate} if args.eval_every else {}
        summary = await gw.fit(model, spec.rollout, train, score_group=hybrid if args.judge else None, config=config,
                               **curve)
        final = summary.final_step
        out["rl_seconds"] = round(time.monotonic() - t, 1)
        out["rl_stop"] = summary.stop_reason
        train_rows = [r for r in gw.load_history(model.run_dir) if r.get("split") == "train"]
        out["rl_train_correct"] = [round(r.get("correct", float("nan")), 3) for r in train_rows]
        out["rl_heldout_curve"] = {step: round(v, 3) for step, v in series(gw.load_history(model.run_dir), "val", "accuracy")}
        out["judge_agreement"] = {"agree": judge_pairs[0], "pairs": judge_pairs[1],
                                  "share": judge_pairs[0] / judge_pairs[1] if judge_pairs[1] else None,
                                  "dropped_groups": judge_stats.dropped_groups}
        out["rl"] = await accuracy(model, final, heldout, spec, "rl")
        say(f"SFT+RL (step {final}, {out['rl_seconds']}s): accuracy {out['rl']['accuracy']:.3f}; train correct "
            f"by step {out['rl_train_correct']}; held-out by step {out['rl_heldout_curve']}; judge agreement {out['judge_agreement']}")
    finally:
        await backend.close()
    out["wall_s"] = round(time.monotonic() - t0, 1)
    save()
    say(f"done: base {out['base']['accuracy']:.3f} -> SFT {out['sft']['accuracy']:.3f} -> SFT+RL "
        f"{out['rl']['accuracy']:.3f}; wall {out['wall_s'] / 60:.1f} min")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--path", default=".groupwise")
    p.add_argument("--name", default=None)
    p.add_argument("--heldout", type=int, default=None, help="first N held-out questions (default: all 48)")
    p.add_argument("--demos", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sft-lr", type=float, default=3e-4)
    p.add_argument("--steps", type=int, default=8, help="GRPO steps after the warm start")
    p.add_argument("--rollouts", type=int, default=8)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--rl-lr", type=float, default=1e-4)
    p.add_argument("--kl-coef", type=float, default=0.0,
                   help="weight of a KL term anchored at the last SFT step (TrainConfig.kl_reference_step); 0: none")
    p.add_argument("--eval-every", type=int, default=0,
                   help="also measure the held-out accuracy every N GRPO steps (a curve; 0: only at the end)")
    p.add_argument("--no-judge", dest="judge", action="store_false", help="ground-truth reward only")
    p.add_argument("--scale-rewards", action="store_true",
                   help="divide each group's advantages by its reward std (GRPO) instead of reward - mean")
    p.add_argument("--normalize", default="token", choices=("token", "sequence"),
                   help="the GRPO loss averaged over all trainable tokens (DAPO) or per sequence first")
    p.add_argument("--tool-mode", default="text", choices=("native", "text"),
                   help="native: OpenAI tools under the server's tool-call grammar (~1300 tokens a transcript); "
                        "text: tools described in the system prompt, calls written as text (~700 tokens)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the GRPO rollouts")
    asyncio.run(main(p.parse_args()))
