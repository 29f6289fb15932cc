"""Synchronous against asynchronous `gw.fit` on one env and seed, where rollouts wait on slow tools.

    python bench/async_pipeline.py --device cpu                                   # CPU smoke run (tiny model)
    python bench/async_pipeline.py --device cuda --arch qwen2.5-0.5b --partial    # one GPU, ~6 minutes

The env (a latency env): each rollout is a multi-turn tool conversation. Every assistant turn is a real
chat request to the model; between turns the "tool" answers after a long-tailed time (lognormal, median
--tool-median-s, sigma --tool-sigma, capped at --tool-cap-s), seeded by the rollout's own seed, so the
synchronous and the asynchronous run wait exactly as long on the same rollouts. Every group then waits
for a judge call (a stand-in that sleeps like one: lognormal around --judge-median-s; it keeps the
rewards). The reward is graded on the text (the share of 'e' characters: something a random-weights
model can move); validation is the same reward on held-out scenarios.

Runs, in one process, the same seed and scenarios: `sync` (LoopConfig.max_steps_off_policy=0) and
`async` (max_steps_off_policy=--d, TrainConfig(off_policy="tis"), rollouts pinned to their scheduled
policy); --partial adds a run with partial rollouts. Printed per run:
- wall time, steps/hour, trained tokens/s (trainable tokens of the trained steps / wall time);
- trainer busy share: the share of the wall time the trainer spent in `model.train` (the rest of the
  GPU's time is generation, which the engine interleaves);
- the waiting time: what the trainer waited for its batches (async: the tail the pipeline did not hide);
- mean staleness of the trained tokens (policy versions behind the trainer);
- the systems score of ART's pipeline work: accepted train tokens/s x a freshness discount, here the mean
  over trained tokens of 0.5^staleness (a token one version old counts half: old tails cost more than
  their mean age says); zero-variance or late groups are not accepted;
- train reward and validation per step, with the wall-clock minute each step ended at, so a speed-up
  bought with a worse policy shows.

Models: --arch tiny-qwen (CPU) or a Qwen2.5 shape (bench/train_step.py's ARCHS), random weights with
SmolLM2's tokenizer, built by `random_model` as bench/scaling.py does (no hub). Only the systems numbers
mean something with random weights; the curves show that async trains the same amount per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def random_model(name: str, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    """`load_model` for the backend: ``random:<arch>`` builds bench/train_step.py's shape on `device`."""
    from train_step import build_model

    return build_model(name.removeprefix("random:"), device or "cuda", dtype, seed=0)


def make_env(args: Any) -> tuple[Any, Any, Any, Any]:
    """(scenario class, rollout, judge, validate) of the latency env."""
    from pydantic import BaseModel

    import groupwise as gw
    from groupwise.core.choices import choice_to_message

    class Task(BaseModel):
        id: int
        question: str
        sampling_seed: int | None = None  # fit seeds each training rollout (LoopConfig.seed_rollouts)

    def latency(rng: random.Random, median: float, sigma: float, cap: float) -> float:
        return min(cap, median * math.exp(sigma * rng.gauss(0.0, 1.0)))

    async def rollout(model: Any, task: Task) -> Any:
        rng = random.Random(f"{task.id}:{task.sampling_seed}")  # the same waits in every run
        client = model.openai_client()
        messages: list[Any] = [{"role": "user", "content": task.question}]
        for turn in range(args.turns):
            sent = [m if isinstance(m, dict) else choice_to_message(m) for m in messages]
            r = await client.chat.completions.create(
                model=model.inference_name(), messages=sent, max_tokens=args.completion_len, temperature=1.0,
                seed=None if task.sampling_seed is None else task.sampling_seed + turn)
            messages.append(r.choices[0])
            if turn < args.turns - 1:
                await asyncio.sleep(latency(rng, args.tool_median_s, args.tool_sigma, args.tool_cap_s))
                messages.append({"role": "user", "content": f"Tool result {turn}: {rng.randint(0, 999)}. Go on."})
        text = " ".join(c.message.content or "" for c in messages if not isinstance(c, dict))
        return gw.Trajectory(messages_and_choices=messages, reward=text.count("e") / max(len(text), 1))

    async def judge(group: Any) -> Any:
        seed = group.metadata.get("scenario_index", 0)
        rewards = ",".join(f"{t.reward:.6f}" for t in group.trajectories)
        await asyncio.sleep(latency(random.Random(f"judge:{seed}:{rewards}"), args.judge_median_s, 0.5,
                                    4 * args.judge_median_s))
        return group

    def validate(trajectory: Any) -> float:
        return trajectory.reward

    return Task, rollout, judge, validate


async def run_one(args: Any, label: str, d: int, partial: bool) -> dict[str, Any]:
    import groupwise as gw
    from async_pipeline import random_model as load_model  # importable by the workers (this file is __main__)
    from train_step import QUESTIONS

    Task, rollout, judge, validate = make_env(args)
    tasks = [Task(id=i, question=f"{QUESTIONS[i % len(QUESTIONS)]} (case {i})") for i in range(args.scenarios)]
    val = [Task(id=10_000 + i, question=f"{QUESTIONS[i % len(QUESTIONS)]} (held out {i})", sampling_seed=i)
           for i in range(args.val_scenarios)]
    path = tempfile.mkdtemp(prefix=f"gw-async-{label}-")
    backend = gw.LocalBackend(
        path=path, device=args.device if args.device == "cpu" else "cuda:0", dtype=args.dtype,
        lora=gw.LoraConfig(rank=args.rank, alpha=2 * args.rank), load_model=load_model,
        max_batch_size=max(64, args.prompts * args.group_size * (d + 1)), served_steps=d + 2,
        engine_kwargs={"max_seq_len": 2048},
    )
    model = gw.TrainableModel(f"async-{label}", project="bench", base_model=f"random:{args.arch}")
    await model.register(backend)
    config = gw.LoopConfig(
        rollouts_per_group=args.group_size, groups_per_step=args.prompts, max_steps=args.steps,
        eval_every=args.eval_every, patience=10_000, num_epochs=100, seed=args.seed, metric="score",
        max_steps_off_policy=d, partial_rollouts=partial, max_exceptions=0.25,
        train_config=gw.TrainConfig(learning_rate=args.lr, off_policy="tis" if d else "none", max_seq_len=2048,
                                    micro_batch_tokens=args.micro_batch_tokens))
    t0 = time.perf_counter()
    try:
        summary = await gw.fit(model, rollout, tasks, val_scenarios=val, score_group=judge, validate=validate,
                               config=config)
    finally:
        await backend.close()
    wall = time.perf_counter() - t0
    return summarise(label, summary.run_dir, wall, summary.final_step)


def summarise(label: str, run_dir: str, wall: float, steps: int) -> dict[str, Any]:
    from datetime import datetime

    import groupwise as gw
    from groupwise.runs.series import rows

    history = gw.load_history(run_dir)
    train, loop, val = rows(history, "train"), rows(history, "loop"), rows(history, "val")
    tokens = sum(r.get("trainable_tokens", 0.0) for r in train)
    # every trained token's age (trainer step - the policy version that sampled it), from its provenance
    ages = [r["step"] - v for r in train for g in gw.load_trajectories(run_dir, "train", r["step"])
            for t in g for v in t.policy_versions()]
    discount = statistics.mean(0.5 ** a for a in ages) if ages else 1.0
    stamps = [datetime.fromisoformat(r["recorded_at"]) for r in train]  # when each step's train row was written
    start = min(datetime.fromisoformat(r["recorded_at"]) for r in history if "recorded_at" in r)
    minute = [(s - start).total_seconds() / 60 for s in stamps]
    return {
        "run": label, "steps": steps, "wall_s": wall, "steps_per_hour": 3600 * steps / wall,
        "trained_tok_s": tokens / wall,
        "busy_share": sum(r.get("time/train_s", 0.0) for r in loop) / wall,
        "wait_s": sum(r.get("time/wait_s", r.get("time/gather_s", 0.0) + r.get("time/reward_s", 0.0)) for r in loop),
        "staleness": statistics.mean(ages) if ages else 0.0, "freshness": discount,
        "late_groups": sum(r.get("pipeline/late_groups", 0) for r in loop),
        "systems_score": tokens / wall * discount,
        "curve": [{"step": r["step"], "minute": m, "reward": r.get("reward")} for r, m in zip(train, minute)],
        "val": [{"step": r["step"], "score": r.get("score"), "lo": r.get("score_lo"), "hi": r.get("score_hi")}
                for r in val],
    }


def print_report(results: list[dict[str, Any]], card: str, args: Any) -> None:
    print(f"\n{args.arch} (random init), {card}; {args.prompts} groups x {args.group_size} rollouts x "
          f"{args.turns} turns x {args.completion_len} tokens; tool median {args.tool_median_s}s sigma "
          f"{args.tool_sigma} (cap {args.tool_cap_s}s), judge median {args.judge_median_s}s; {args.steps} steps")
    cols = ["run", "wall_s", "steps_per_hour", "trained_tok_s", "busy_share", "wait_s", "staleness",
            "freshness", "late_groups", "systems_score"]
    print("| " + " | ".join(f"{c:>14}" for c in cols) + " |")
    print("|" + "|".join("-" * 16 for _ in cols) + "|")
    for r in results:
        print("| " + " | ".join(f"{r[c]:>14}" if isinstance(r[c], str) else f"{r[c]:14.3f}" for c in cols) + " |")
    sync = next((r for r in results if r["run"] == "sync"), None)
    for r in results:
        if sync is not None and r is not sync:
            print(f"{r['run']}: {sync['wall_s'] / r['wall_s']:.2f}x the synchronous run's speed (wall time)")
    for r in results:
        print(f"\n{r['run']}: train reward by step (minute)  " + "  ".join(
            f"{c['step']}:{c['reward']:.4f} ({c['minute']:.1f}m)" for c in r["curve"]))
        print(f"{r['run']}: validation by step  " + "  ".join(
            f"{v['step']}:{v['score']:.4f} [{v['lo'] if v['lo'] is None else round(v['lo'], 4)}, "
            f"{v['hi'] if v['hi'] is None else round(v['hi'], 4)}]" for v in r["val"]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default=None, help="bench/train_step.py's ARCHS (default: tiny-qwen on cpu, qwen2.5-0.5b on cuda)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None)
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 4 on cpu, 10 on cuda)")
    p.add_argument("--d", type=int, default=2, help="max_steps_off_policy of the async run")
    p.add_argument("--partial", action="store_true", help="also run async with partial rollouts")
    p.add_argument("--prompts", type=int, default=None, help="groups per step (default 2 on cpu, 8 on cuda)")
    p.add_argument("--group-size", type=int, default=None, help="rollouts per group (default 4 on cpu, 8 on cuda)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--completion-len", type=int, default=None, help="tokens per turn (default 8 on cpu, 64 on cuda)")
    p.add_argument("--tool-median-s", type=float, default=None, help="median tool latency (default 0.5 cpu, 1 cuda)")
    p.add_argument("--tool-sigma", type=float, default=1.0, help="lognormal sigma of the tool latency (the tail)")
    p.add_argument("--tool-cap-s", type=float, default=None, help="the longest tool call (default 10x the median)")
    p.add_argument("--judge-median-s", type=float, default=None, help="median judge latency per group (default 0.5 cpu, 2 cuda)")
    p.add_argument("--eval-every", type=int, default=None, help="validate every this many steps (default 2 on cpu, 5 on cuda)")
    p.add_argument("--scenarios", type=int, default=256)
    p.add_argument("--val-scenarios", type=int, default=None, help="default 4 on cpu, 16 on cuda")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    gpu = args.device == "cuda"
    for name, cpu_value, gpu_value in (("arch", "tiny-qwen", "qwen2.5-0.5b"), ("steps", 4, 10), ("prompts", 2, 8),
                                       ("group_size", 4, 8), ("completion_len", 8, 64), ("tool_median_s", 0.5, 1.0),
                                       ("judge_median_s", 0.5, 2.0), ("val_scenarios", 4, 16), ("eval_every", 2, 5)):
        if getattr(args, name) is None:
            setattr(args, name, gpu_value if gpu else cpu_value)
    args.tool_cap_s = args.tool_cap_s or 10 * args.tool_median_s

    sys.path.insert(0, str(HERE))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    card = "cpu"
    if gpu:
        import torch

        card = torch.cuda.get_device_name(0)
    runs = [("sync", 0, False), ("async", args.d, False)] + ([("async-partial", args.d, True)] if args.partial else [])
    results = []
    for label, d, partial in runs:
        print(f"== {label} (max_steps_off_policy={d}{', partial rollouts' if partial else ''})", flush=True)
        results.append(asyncio.run(run_one(args, label, d, partial)))
        print_report(results, card, args)
        if args.json:  # after every run: a call that runs out of time keeps the runs it finished
            Path(args.json).write_text(json.dumps({"args": vars(args), "card": card, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
