"""Several runs' updates on one base: each run's own update in turn, against one joint update.

    python bench/joint_update.py --device cuda --arch qwen2.5-0.5b   # one GPU, random Qwen2.5-0.5B shape
    python bench/joint_update.py --device cpu --arch smollm2         # SmolLM2-135M on this machine's CPU
    python bench/joint_update.py --device cpu --arch tiny-qwen       # a smoke test (numbers mean nothing)

Runs registered on one backend share the base weights. Alone, their updates run one after another: each
run's `Trainer.train_step` (its micro-batches' forward and backward with its adapter, then its optimizer
step). Joint (`training/joint.py`, what the worker does when several runs' updates wait at once): one pass
over every run's rows, each row through its own run's adapter, each run's loss with its own normalisers,
then each run's own clipped optimizer step; micro-batches are each run's own, packed together where they
fit one token budget (`joint_plan`).

`--runs` adapters, each with --rows sequences (a comma list: a line each) of a ~--prompt-len prompt and
--completion-len trained tokens (random ids, seeded), --micro-batch-tokens a micro-batch. Each timed step
starts both cases from the same adapters and optimizer state (restored between them), so the largest
difference between the adapters they leave is the joint update's numerical agreement with training alone.

Printed: per line the median time of --steps after --warmup, alone / joint, the micro-batches (all runs
alone, and joint), and that difference relative to the adapter's largest entry.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from typing import Any

import torch


def make_batch(rows: int, prompt_len: int, completion_len: int, vocab: int, seed: int) -> Any:
    from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence

    rng = random.Random(seed)
    seqs = []
    for i in range(rows):
        p = prompt_len + rng.randrange(-prompt_len // 4, prompt_len // 4 + 1)
        ids = [rng.randrange(100, vocab) for _ in range(p + completion_len)]
        mask = [False] * p + [True] * completion_len
        old = [float("nan")] * p + [-rng.uniform(0.5, 3.0) for _ in range(completion_len)]
        seqs.append(TokenizedSequence(ids, mask, old, advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.0),
                                      group_index=i // 8, trajectory_index=i % 8))
    return TokenizedBatch(sequences=seqs, num_groups=max(1, rows // 8))


def main() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_step import build_model

    from groupwise.config import LoraConfig, TrainConfig, micro_batch_tokens_for
    from groupwise.training.adapters import add_lora_adapter, wrap_with_lora
    from groupwise.training.finite import restore, snapshot
    from groupwise.training.joint import JointPart, joint_plan, joint_problem, joint_train_step
    from groupwise.training.trainer import Trainer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--arch", default="tiny-qwen")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--rows", default="8,16,64", help="rows (sequences) of each run's step; a comma list: a line each")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--micro-batch-tokens", type=int, default=None, help="default: TrainConfig's, the device's budget")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()

    model, tok = build_model(args.arch, args.device, None)
    pm = wrap_with_lora(model, LoraConfig(rank=16, alpha=32, seed=0), adapter_name="run0")
    for r in range(1, args.runs):
        add_lora_adapter(pm, LoraConfig(rank=16, alpha=32, seed=r), f"run{r}")
    with torch.no_grad():  # B starts at zero: give every adapter a nonzero, distinct B so the runs differ
        g = torch.Generator().manual_seed(1)
        for n, prm in pm.named_parameters():
            if "lora_B" in n:
                prm.copy_((torch.randn(prm.shape, generator=g) * 0.01).to(prm))
    vocab = min(tok.vocab_size, pm.get_input_embeddings().weight.shape[0])
    pad = tok.pad_token_id or 0
    trainers = [Trainer(pm, pad_token_id=pad, adapter_name=f"run{r}") for r in range(args.runs)]
    config = TrainConfig(learning_rate=1e-4, micro_batch_tokens=args.micro_batch_tokens)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    def adapters() -> list[torch.Tensor]:
        return [prm.detach().float().clone() for t in trainers for _, prm in t.trainable_named_parameters()]

    def measure(batches: list[Any]) -> tuple[dict[str, float], float, int, int]:
        parts = [JointPart(t, b, config) for t, b in zip(trainers, batches)]
        problems = [joint_problem(part) for part in parts]
        assert not any(problems), problems

        def alone(step: int) -> None:
            for t, b in zip(trainers, batches):
                t.train_step(b, config, step=step)

        def joint(step: int) -> None:
            results = joint_train_step(parts, step=step)
            bad = [r for r in results if isinstance(r, BaseException)]
            if bad:
                raise bad[0]

        times: dict[str, list[float]] = {"alone": [], "joint": []}
        rel = 0.0
        for i in range(args.warmup + args.steps):
            for t in trainers:  # the optimizers exist before the snapshot, so both cases restore the same state
                t.ensure_optimizer(config, "grpo")
            start = [snapshot([prm for _, prm in t.trainable_named_parameters()], t.optimizer) for t in trainers]
            after: dict[str, list[torch.Tensor]] = {}
            for name, fn in (("alone", alone), ("joint", joint)):
                for t, s in zip(trainers, start):  # a copy: the step updates restored moments in place
                    restore(t.trainable_named_parameters(), t.optimizer, copy.deepcopy(s))
                sync()
                t0 = time.perf_counter()
                fn(i)
                sync()
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
                after[name] = adapters()
            rel = max(rel, max(float((x - y).abs().max() / x.abs().max().clamp_min(1e-30))
                               for x, y in zip(after["alone"], after["joint"])))
        plan = joint_plan(parts)
        return {k: statistics.median(v) for k, v in times.items()}, rel, plan.own, len(plan.micro_batches)

    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    budget = micro_batch_tokens_for(args.micro_batch_tokens, torch.device(args.device).type)
    print(f"{args.runs} runs, {args.arch}, {card}, ~{args.prompt_len}+{args.completion_len} tokens a sequence, "
          f"micro-batches of {budget} tokens; whole updates (optimizer steps included), "
          f"median of {args.steps}")
    print("| rows a run | tokens | alone s | joint s | alone / joint | micro-batches alone / joint "
          "| largest adapter difference |")
    print("|---|---|---|---|---|---|---|")
    for rows in [int(r) for r in str(args.rows).split(",")]:
        batches = [make_batch(rows, args.prompt_len, args.completion_len, vocab, seed=r) for r in range(args.runs)]
        med, rel, own, packed = measure(batches)
        tokens = sum(len(s) for bt in batches for s in bt.sequences)
        print(f"| {rows} | {tokens} | {med['alone']:.3f} | {med['joint']:.3f} | "
              f"{med['alone'] / med['joint']:.2f}x | {own} / {packed} | {rel:.1e} |", flush=True)
    print("(the adapter difference: the largest entry's, relative to that tensor's largest entry)")


if __name__ == "__main__":
    main()
