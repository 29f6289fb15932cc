"""End-to-end GRPO step throughput of `LocalBackend(devices=N)` at N = 1, 2, 4 GPUs, the same work per GPU.

    python bench/scaling.py --arch qwen2.5-0.5b --gpus 1 2 4
    python bench/scaling.py --arch qwen2.5-7b --gpus 1 2 4 --layer-checkpointing
    python bench/scaling.py --arch tiny-qwen --device cpu --gpus 1 2      # smoke test on the CPU (gloo)

The model: random-init weights of a Qwen2.5 shape in bf16 with SmolLM2's tokenizer (bench/train_step.py's
shapes and builder), built by each worker on its own GPU (`random_model`, passed as the backend's
`load_model`). Only speed is measured.

Per N: a `LocalBackend` with one worker process per device (N = 1 too, so every N runs the same code path),
then --warmup untimed and --steps timed steps. A step is what a user's loop does: N x --prompts groups of
--group-size rollouts, each rollout one chat request through the user's one OpenAI client (the router
spreads groups over the replicas), --completion-len tokens each (random weights almost never sample EOS),
a reward, then `model.train` (tokenise, each rank's share of the update, gradient all-reduce, rank 0's
checkpoint, every engine's adapter swap and check).

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


async def one_step(model: Any, args: Any, n_gpus: int, step: int, config: Any, per_group: bool) -> dict[str, float]:
    """One GRPO step as a user's loop runs it; returns its times and where the rollout time went."""
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
    result = await model.train(groups, config=config)
    t2 = time.perf_counter()
    generated = sum(len(t.choices()[0].token_ids or []) for g in groups for t in g)
    m = result.metrics
    sent = [a for a, _, _ in spans]
    by_replica = {}
    for a, b, r in spans:
        lo, hi, k = by_replica.get(r, (a, b, 0))
        by_replica[r] = (min(lo, a), max(hi, b), k + 1)
    return {"step": t2 - t0, "rollout": t1 - t0, "train": t2 - t1, "update": m["update_time"],
            "train_rest": (t2 - t1) - m["update_time"], "generated": generated, "trainable": m["trainable_tokens"],
            "send_spread": max(sent) - min(sent), "driver_cpu": cpu1 - cpu0,
            "replica_requests": min(k for _, _, k in by_replica.values()),
            "replica_span_max": max(hi - lo for lo, hi, _ in by_replica.values()),
            "replica_span_min": min(hi - lo for lo, hi, _ in by_replica.values())}


async def run_case(args: Any, n_gpus: int) -> dict[str, Any]:
    import groupwise as gw
    from scaling import random_model as load_model  # importable by the workers (this file runs as __main__)

    devices = [f"{args.device}:{i}" if args.device == "cuda" else args.device for i in range(n_gpus)]
    max_batch = args.prompts * args.group_size
    backend = gw.LocalBackend(
        path=tempfile.mkdtemp(prefix="gw-scaling-"), devices=devices, dtype=args.dtype,
        lora=gw.LoraConfig(rank=args.rank, alpha=2 * args.rank), max_batch_size=max_batch,
        best_checkpoint_metric=None, served_steps=1, load_model=load_model,
        engine_kwargs={"max_seq_len": 1024},
    )
    model = gw.TrainableModel(f"scale{n_gpus}", project="bench", base_model=f"random:{args.arch}")
    t = time.perf_counter()
    await model.register(backend)
    start_s = time.perf_counter() - t
    config = gw.TrainConfig(learning_rate=1e-5, gradient_checkpointing=args.layer_checkpointing,
                            micro_batch_tokens=args.micro_batch_tokens, max_seq_len=1024)
    rows: dict[str, list[dict[str, float]]] = {}
    modes = [m for m in args.modes]
    try:
        for step in range(args.warmup):
            row = await one_step(model, args, n_gpus, step, config, per_group=modes[0] == "group")
            print(f"  N={n_gpus} warm-up {step}: " + fmt(row), flush=True)
        step = args.warmup
        for mode in modes:
            for _ in range(args.steps):
                row = await one_step(model, args, n_gpus, step, config, per_group=mode == "group")
                print(f"  N={n_gpus} {mode} step {step}: " + fmt(row), flush=True)
                rows.setdefault(mode, []).append(row)
                step += 1
    finally:
        await backend.close()
    med = {}
    for mode, timed in rows.items():
        m = {k: statistics.median(r[k] for r in timed) for k in timed[0]}
        m.update(gpus=n_gpus, mode=mode, start_s=start_s, rollout_tok_s=m["generated"] / m["rollout"],
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
        base = next((b for b in results if b["gpus"] == 1 and b["mode"] == r["mode"]), None)
        eff = base["step"] / r["step"] if base else float("nan")
        cells = [f"{r['mode']:>11}", f"{r['gpus']:11d}"] + [f"{r[c]:11.2f}" for c in cols[2:8]] + [
            f"{r['rollout_tok_s']:11.0f}", f"{r['update_tok_s']:11.0f}", f"{100 * eff:10.1f}%"]
        print("| " + " | ".join(cells) + " |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="qwen2.5-0.5b", help="a shape of bench/train_step.py's ARCHS")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--prompts", type=int, default=8, help="groups per GPU per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
    p.add_argument("--layer-checkpointing", action="store_true")
    p.add_argument("--modes", nargs="+", default=["rollout"], choices=["rollout", "group"],
                   help="rollout: one request per rollout (agent code); group: one request of n completions per group")
    p.add_argument("--json", default=None)
    args = p.parse_args()

    sys.path.insert(0, str(HERE))  # `random_model` is pickled by reference as scaling.random_model ...
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])  # ... for the workers

    card = "cpu"
    if args.device == "cuda":
        import torch

        card = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    results = []
    for n in args.gpus:
        try:
            results.extend(asyncio.run(run_case(args, n)).values())
        except Exception:
            traceback.print_exc()
            print(f"N={n} failed; continuing", flush=True)
        print_table(args, results, card)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "card": card, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
