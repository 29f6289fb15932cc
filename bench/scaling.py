"""End-to-end GRPO step throughput of `LocalBackend(devices=N)` at N = 1, 2, 4 GPUs, the same work per GPU.

    python bench/scaling.py --arch qwen2.5-0.5b --gpus 1 2 4
    python bench/scaling.py --arch qwen2.5-7b --gpus 1 2 4 --layer-checkpointing
    python bench/scaling.py --arch tiny-qwen --device cpu --gpus 1 2      # smoke test on the CPU (gloo)
    python bench/scaling.py --gpus 1 4 --placement 1:3 --modes rollout overlap   # 1 trainer + 3 generators

The model: random-init weights of a Qwen2.5 shape in bf16 with SmolLM2's tokenizer (bench/train_step.py's
shapes and builder), built by each worker on its own GPU (`random_model`, passed as the backend's
`load_model`). Only speed is measured.

Per N: a `LocalBackend` with one worker process per device (N = 1 too, so every N runs the same code path),
then --warmup untimed and --steps timed steps. A step is what a user's loop does: N x --prompts groups of
--group-size rollouts, each rollout one chat request through the user's one OpenAI client (the router
spreads groups over the replicas), --completion-len tokens each (random weights almost never sample EOS),
a reward, then `model.train` (tokenise, each rank's share of the update, gradient all-reduce, rank 0's
checkpoint, every engine's adapter swap and check).

--placement T:G runs a case on T + G GPUs with `train_workers=T` (backend/options.py): T GPUs only train,
G only generate (the same work per GPU: (T + G) x --prompts groups a step), printed as "Tt+Gg" in the gpus
column. A synchronous loop (modes rollout, group) leaves the trainers idle during rollouts and the
generators idle during the update; mode "overlap" is what a pipelined loop does
(`LoopConfig.max_steps_off_policy=1`): the rollouts of step k+1 run while step k trains (requests for
the latest adapter, so they switch to k+1 when it is served). There a replica of the default placement
pauses its engine for each update, while generators keep generating.

Printed per N (medians over the timed steps):
- rollout tok/s: generated tokens / rollout time; update tok/s: trainable tokens / time of `model.train`;
- step s and its parts: rollout, update (the optimizer step incl. forward/backward, slowest rank) and
  the rest of train (tokenising, waiting for the slowest rank, checkpoint, adapter swap and checks);
- scaling efficiency: tokens per step-second at N GPUs / (N x that at 1 GPU), i.e. T_step(1) / T_step(N)
  since the work per GPU is fixed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def random_model(name: str, device: str | None = None, dtype: str | None = None) -> tuple[Any, Any]:
    """`load_model` for the backend: ``random:<arch>`` builds bench/train_step.py's shape on `device`."""
    from train_step import build_model

    return build_model(name.removeprefix("random:"), device or "cuda", dtype, seed=0)


async def rollouts(model: Any, args: Any, n_gpus: int, step: int, per_group: bool) -> tuple[list[Any], dict[str, float]]:
    """One step's groups, sampled through the user's one client; with their times and where they went."""
    import groupwise as gw
    from groupwise.backend.routing import REPLICA_HEADER
    from train_step import QUESTIONS, reward_fn

    client = model.openai_client()
    spans: list[tuple[float, float, int]] = []  # (sent, answered, replica) of every request

    async def ask(prompt: str, seed: int, n: int) -> list[gw.Trajectory]:
        messages = [{"role": "user", "content": prompt}]
        t = time.perf_counter()
        raw = await client.chat.completions.with_raw_response.create(
            model=model.inference_name(), messages=messages, max_tokens=args.completion_len, temperature=1.0,
            seed=seed, n=n)
        r = raw.parse()
        spans.append((t, time.perf_counter(), int(raw.headers.get(REPLICA_HEADER, -1))))
        return [gw.Trajectory(messages_and_choices=[*messages, c], reward=reward_fn(c.message.content or ""))
                for c in r.choices]

    n_groups = n_gpus * args.prompts
    prompts = [f"{QUESTIONS[g % len(QUESTIONS)]} (variant {g}, step {step})" for g in range(n_groups)]
    t0, cpu0 = time.perf_counter(), time.process_time()
    if per_group:  # one request of n completions per group
        answers = await asyncio.gather(*(ask(p, 100_000 * step + g, args.group_size) for g, p in enumerate(prompts)))
        groups = [gw.TrajectoryGroup(a) for a in answers]
    else:  # one request per rollout, as agent code does
        answers = await asyncio.gather(*(ask(p, 100_000 * step + args.group_size * g + i, 1)
                                         for g, p in enumerate(prompts) for i in range(args.group_size)))
        groups = [gw.TrajectoryGroup([t for a in answers[g * args.group_size:(g + 1) * args.group_size] for t in a])
                  for g in range(n_groups)]
    t1, cpu1 = time.perf_counter(), time.process_time()
    sent = [a for a, _, _ in spans]
    by_replica = {}
    for a, b, r in spans:
        lo, hi, k = by_replica.get(r, (a, b, 0))
        by_replica[r] = (min(lo, a), max(hi, b), k + 1)
    return groups, {"rollout": t1 - t0, "generated": sum(len(t.choices()[0].token_ids or []) for g in groups for t in g),
                    "send_spread": max(sent) - min(sent), "driver_cpu": cpu1 - cpu0,
                    "replica_requests": min(k for _, _, k in by_replica.values()),
                    "replica_span_max": max(hi - lo for lo, hi, _ in by_replica.values()),
                    "replica_span_min": min(hi - lo for lo, hi, _ in by_replica.values())}


def step_row(step_s: float, train_s: float, roll: dict[str, float], metrics: dict[str, float]) -> dict[str, float]:
    return {"step": step_s, "rollout": roll["rollout"], "train": train_s, "update": metrics["update_time"],
            "train_rest": train_s - metrics["update_time"], "generated": roll["generated"],
            "trainable": metrics["trainable_tokens"], **{k: v for k, v in roll.items() if k not in ("rollout", "generated")}}


async def one_step(model: Any, args: Any, n_gpus: int, step: int, config: Any, per_group: bool) -> dict[str, float]:
    """One GRPO step as a user's loop runs it; returns its times and where the rollout time went."""
    t0 = time.perf_counter()
    groups, roll = await rollouts(model, args, n_gpus, step, per_group)
    t1 = time.perf_counter()
    result = await model.train(groups, config=config)
    t2 = time.perf_counter()
    return step_row(t2 - t0, t2 - t1, roll, result.metrics)


async def overlapped_step(model: Any, args: Any, n_gpus: int, step: int, config: Any,
                          groups: list[Any]) -> tuple[dict[str, float], list[Any]]:
    """Train on `groups` (the last step's rollouts) while the rollouts of the next step run; returns the
    step's times and those rollouts (mode "overlap" in the module doc)."""
    async def train() -> tuple[Any, float]:
        t = time.perf_counter()
        result = await model.train(groups, config=config)
        return result, time.perf_counter() - t

    t0 = time.perf_counter()
    training = asyncio.ensure_future(train())
    next_groups, roll = await rollouts(model, args, n_gpus, step, per_group=False)
    result, train_s = await training
    return step_row(time.perf_counter() - t0, train_s, roll, result.metrics), next_groups


async def run_case(args: Any, n_gpus: int, train_workers: int | None = None) -> dict[str, Any]:
    import groupwise as gw
    from scaling import random_model as load_model  # importable by the workers (this file runs as __main__)

    devices = [f"{args.device}:{i}" if args.device == "cuda" else args.device for i in range(n_gpus)]
    label = f"{train_workers}t+{n_gpus - train_workers}g" if train_workers else ""
    max_batch = args.prompts * args.group_size
    backend = gw.LocalBackend(
        path=tempfile.mkdtemp(prefix="gw-scaling-"), devices=devices, dtype=args.dtype,
        lora=gw.LoraConfig(rank=args.rank, alpha=2 * args.rank), max_batch_size=max_batch,
        best_checkpoint_metric=None, served_steps=1, load_model=load_model,
        engine_kwargs={"max_seq_len": 1024}, train_workers=train_workers,
    )
    model = gw.TrainableModel(f"scale{n_gpus}", project="bench", base_model=f"random:{args.arch}")
    t = time.perf_counter()
    await model.register(backend)
    start_s = time.perf_counter() - t
    config = gw.TrainConfig(learning_rate=1e-5, gradient_checkpointing=args.layer_checkpointing,
                            micro_batch_tokens=args.micro_batch_tokens, max_seq_len=1024)
    rows: dict[str, list[dict[str, float]]] = {}
    modes = [m for m in args.modes]
    name = f"N={label or n_gpus}"
    try:
        for step in range(args.warmup):
            row = await one_step(model, args, n_gpus, step, config, per_group=modes[0] == "group")
            print(f"  {name} warm-up {step}: " + fmt(row), flush=True)
        step = args.warmup
        for mode in modes:
            groups = None
            if mode == "overlap":  # the first step's rollouts, untimed: each timed step trains the last ones
                groups, _ = await rollouts(model, args, n_gpus, step, per_group=False)
                step += 1
            for _ in range(args.steps):
                if mode == "overlap":
                    row, groups = await overlapped_step(model, args, n_gpus, step, config, groups)
                else:
                    row = await one_step(model, args, n_gpus, step, config, per_group=mode == "group")
                print(f"  {name} {mode} step {step}: " + fmt(row), flush=True)
                rows.setdefault(mode, []).append(row)
                step += 1
    finally:
        await backend.close()
    med = {}
    for mode, timed in rows.items():
        m = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
        m.update(gpus=n_gpus, placement=label, mode=mode, start_s=start_s, rollout_tok_s=m["generated"] / m["rollout"],
                 update_tok_s=m["trainable"] / m["train"], step_tok_s=m["generated"] / m["step"])
        med[mode] = m
    return med


def fmt(row: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.2f}" for k, v in row.items())


def print_table(args: Any, results: list[dict[str, Any]], card: str) -> None:
    print(f"\n{args.arch} (random init, {args.dtype or ('bf16' if args.device == 'cuda' else 'fp32')}), {card}; per GPU: {args.prompts} prompts x "
          f"{args.group_size} rollouts x {args.completion_len} tokens; LoRA r={args.rank}; "
          f"layer checkpointing {'on' if args.layer_checkpointing else 'off'}; medians of {args.steps} steps")
    cols = ["mode", "gpus", "step", "rollout", "update", "train_rest", "send_spread", "driver_cpu",
            "rollout_tok_s", "update_tok_s", "efficiency"]
    print("| " + " | ".join(f"{c:>11}" for c in cols) + " |")
    print("|" + "|".join("-" * 13 for _ in cols) + "|")
    for r in results:
        base = next((b for b in results if b["gpus"] == 1 and b["mode"] == r["mode"] and not b.get("placement")), None)
        eff = base["step"] / r["step"] if base else float("nan")
        cells = [f"{r['mode']:>11}", f"{r.get('placement') or r['gpus']:>11}"] + [f"{r[c]:11.2f}" for c in cols[2:8]] + [
            f"{r['rollout_tok_s']:11.0f}", f"{r['update_tok_s']:11.0f}", f"{100 * eff:10.1f}%"]
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="qwen2.5-0.5b", help="a shape of bench/train_step.py's ARCHS")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--gpus", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--placement", nargs="*", default=[], metavar="T:G",
                   help="also run T trainer GPUs + G generator GPUs (LocalBackend train_workers=T), e.g. 1:3")
    p.add_argument("--prompts", type=int, default=8, help="groups per GPU per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    p.add_argument("--layer-checkpointing", action="store_true")
    p.add_argument("--modes", nargs="+", default=["rollout"], choices=["rollout", "group", "overlap"],
                   help="rollout: one request per rollout (agent code); group: one request of n completions per "
                   "group; overlap: rollouts of step k+1 while step k trains, one request per rollout")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    try:
        splits = [tuple(int(x) for x in s.split(":")) for s in args.placement]
        assert all(len(t) == 2 and t[0] >= 1 and t[1] >= 1 for t in splits)
    except (ValueError, AssertionError):
        p.error(f"--placement {' '.join(args.placement)}: give T:G pairs of trainer and generator GPUs, e.g. 1:3")

    sys.path.insert(0, str(HERE))  # `random_model` is pickled by reference as scaling.random_model ...
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])  # ... for the workers

    card = "cpu"
    if args.device == "cuda":
        import torch

        card = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    results = []
    for n, trainers in [*((n, None) for n in args.gpus), *((t + g, t) for t, g in splits)]:
        try:
            results.extend(asyncio.run(run_case(args, n, trainers)).values())
        except Exception:
            traceback.print_exc()
            print(f"N={n}{f' (train_workers={trainers})' if trainers else ''} failed; continuing", flush=True)
        print_table(args, results, card)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "card": card, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
