"""Several runs' updates on one base: one pass per adapter, against one mixed-adapter pass.

    python bench/mixed_update.py --device cuda --arch qwen2.5-0.5b   # one GPU, random Qwen2.5-0.5B shape
    python bench/mixed_update.py --device cpu --arch tiny-qwen       # a smoke test (numbers mean nothing)

Several runs registered on one backend share the base weights; today their updates run one after
another, each a forward and backward over its own rows with its own adapter active (the trainer's
`forward_backward`). The other way (what issue "many runs, one base" asks to measure): one forward and
backward over every run's rows at once, each row through its own run's adapter, each run's loss
normalised by its own counts, the losses summed. The adapters are disjoint parameters, so one backward
gives each its own gradient. Only the forward and backward are timed: the optimizer steps are the same
work either way.

`--runs` adapters, each with --rows sequences (a list: one line each) of a --prompt-len prompt and --completion-len trained
tokens (random ids, seeded), micro-batches of --micro-batch-tokens padded tokens. The mixed pass sorts
the runs' rows into the same micro-batch planner and keeps each run's rows contiguous inside a
micro-batch, so a LoRA layer computes the base once and each run's low-rank term on its slice.

Printed: per case the median time of --steps timed passes after --warmup, the ratio per-adapter / mixed,
and the largest difference between the two cases' gradients relative to the gradient's size (the mixed
pass must compute the same function).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
import types
from typing import Any

import torch


def _segment_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A LoRA layer over rows of several adapters: the base once, each adapter's term on its rows."""
    result = self.base_layer(x)  # [B, T, out]
    parts = []
    for name, start, end in self._bench_segments:
        xs = x[start:end]
        h = torch.nn.functional.linear(xs, self.lora_A[name].weight)  # [b, T, r]
        parts.append(torch.nn.functional.linear(h, self.lora_B[name].weight * self.scaling[name]))
    return result + torch.cat(parts, dim=0)


@contextlib.contextmanager
def mixed_layers(tuners: list[Any], segments: list[tuple[str, int, int]]):
    for m in tuners:
        m._bench_segments = segments
        m.forward = types.MethodType(_segment_forward, m)
    try:
        yield
    finally:
        for m in tuners:
            m.__dict__.pop("forward", None)
            m.__dict__.pop("_bench_segments", None)


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
    return TokenizedBatch(sequences=seqs, num_groups=rows // 8)


def mixed_forward_backward(trainers: list[Any], batches: list[Any], config: Any) -> None:
    """One forward and backward over every run's rows (module doc)."""
    from groupwise.training.logprobs import token_logprobs
    from groupwise.training.loss import grpo_loss
    from groupwise.training.trainer import _collate, plan_micro_batches

    lead = trainers[0]
    rows = [(r, s) for r, b in enumerate(batches) for s in b.sequences]
    totals = [(b.trainable_tokens, len(b.sequences)) for b in batches]
    plan = plan_micro_batches([len(s) for _, s in rows], config.micro_batch_tokens)
    fwd = lead._training_forward(config)
    tuners = fwd.tuners
    with fwd:
        for indices in plan:
            indices = sorted(indices, key=lambda i: rows[i][0])  # each run's rows contiguous
            mb = _collate([rows[i][1] for i in indices], lead.pad_token_id, lead.device)
            segments, start = [], 0
            for r in range(len(trainers)):
                n = sum(1 for i in indices if rows[i][0] == r)
                if n:
                    segments.append((trainers[r].adapter_name, r, start, start + n))
                    start += n
            with mixed_layers(tuners, [(name, a, b) for name, _, a, b in segments]), fwd.autocast():
                logprobs_BT = token_logprobs(lead.model, mb["input_ids_BT"], mb["attention_BT"], mb["mask_BT"],
                                             chunk_size=config.logprob_chunk_size,
                                             target_index_N=mb["target_index_N"])
            loss = 0
            for _, r, a, b in segments:
                terms = grpo_loss(logprobs_BT[a:b], mb["old_logprobs_BT"][a:b].to(logprobs_BT.dtype),
                                  mb["advantages_B"][a:b].to(logprobs_BT.dtype), mb["mask_BT"][a:b],
                                  epsilon=config.epsilon, epsilon_high=config.epsilon_high, cispo=False,
                                  normalize=config.normalize, num_tokens=totals[r][0], num_sequences=totals[r][1],
                                  max_len=config.max_seq_len)
                loss = loss + terms.loss
            with mixed_layers(tuners, [(name, a, b) for name, _, a, b in segments]):
                loss.backward()


def main() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_step import build_model

    from groupwise.config import LoraConfig, TrainConfig
    from groupwise.training.adapters import add_lora_adapter, wrap_with_lora
    from groupwise.training.trainer import Trainer

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--arch", default="tiny-qwen")
    p.add_argument("--runs", type=int, default=4)
    p.add_argument("--rows", default="16,64", help="rows (sequences) of each run's step; a comma list: a line each")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--completion-len", type=int, default=128)
    p.add_argument("--micro-batch-tokens", type=int, default=16384)
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

    def params(t: Trainer) -> list[torch.nn.Parameter]:
        return [prm for _, prm in t.trainable_named_parameters()]

    def measure(batches: list[Any]) -> tuple[dict[str, float], float]:
        def per_adapter() -> None:
            for t, b in zip(trainers, batches):
                t._activate()
                t._set_mode(True)
                t.forward_backward(b, config)
                t._set_mode(False)

        def mixed() -> None:
            trainers[0]._activate()
            for t in trainers:  # every run's adapter takes gradients in the one pass
                for prm in params(t):
                    prm.requires_grad_(True)
            trainers[0]._set_mode(True)
            mixed_forward_backward(trainers, batches, config)
            trainers[0]._set_mode(False)

        times: dict[str, list[float]] = {"per adapter": [], "mixed": []}
        got: dict[str, list[torch.Tensor]] = {}
        for i in range(args.warmup + args.steps):
            for name, fn in (("per adapter", per_adapter), ("mixed", mixed)):
                for t in trainers:
                    for prm in params(t):
                        prm.grad = None
                sync()
                t0 = time.perf_counter()
                fn()
                sync()
                if i >= args.warmup:
                    times[name].append(time.perf_counter() - t0)
                got[name] = [prm.grad.detach().float().clone() for t in trainers for prm in params(t)]
        rel = max(float((x - y).abs().max() / x.abs().max().clamp_min(1e-30))
                  for x, y in zip(got["per adapter"], got["mixed"]))
        return {k: statistics.median(v) for k, v in times.items()}, rel

    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.runs} runs, {args.arch}, {card}, ~{args.prompt_len}+{args.completion_len} tokens a sequence, "
          f"micro-batches of {args.micro_batch_tokens} tokens; forward+backward of all runs, median of {args.steps}")
    print("| rows a run | tokens | per adapter s | mixed s | per adapter / mixed | largest gradient difference |")
    print("|---|---|---|---|---|---|")
    for rows in [int(r) for r in str(args.rows).split(",")]:
        batches = [make_batch(rows, args.prompt_len, args.completion_len, vocab, seed=r) for r in range(args.runs)]
        med, rel = measure(batches)
        tokens = sum(len(s) for bt in batches for s in bt.sequences)
        print(f"| {rows} | {tokens} | {med['per adapter']:.3f} | {med['mixed']:.3f} | "
              f"{med['per adapter'] / med['mixed']:.2f}x | {rel:.1e} |", flush=True)
    print("(the gradient difference: the largest entry's, relative to that tensor's largest entry)")


if __name__ == "__main__":
    main()
