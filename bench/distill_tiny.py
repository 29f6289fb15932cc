"""On-policy distillation against GRPO alone on a tiny task, on the CPU in minutes: the same tiny student,
the same samples' budget, with a teacher of another base (both estimates of the reverse KL) and without one.

    python bench/distill_tiny.py --steps 8 --seeds 0 1 2

The task: a teacher on another base than the student's (a wider, deeper tiny Llama with the student's
tokenizer) whose LM head favours 16 ids (100-115) in every context. The student (a tiny random Llama with a
rank-4 LoRA, as the training tests use, its final norm x10 so that its distribution is peaked and its logits
answer to its hidden states, as the tests' peaked_tiny_model) samples 8 continuations of 10 tokens per step
from 4 prompts, on policy, and takes one update (learning rate 0.2). Its reward for GRPO is the share of its
sampled tokens among the 16 ids: the task's ground truth, which a student that puts 1e-4 of its mass there
almost never samples, so GRPO alone sees rewards that tie and skips the step, as the loop does. Distillation
trains on the same samples with the teacher's per-token signal (`sampled`, and `topk` with k = 16).
Validation on 4 held-out contexts of 16 tokens, after every step: `kl`, the exact reverse KL to the teacher
over the whole vocabulary (the quantity distillation minimises), and `fav`, the student's mean probability of
the 16 ids per position (the teacher's own is printed first).

It shows the mechanism (the dense per-token signal reaches a target that outcome rewards do not), not the
issue's SmolLM2 target; docs/benchmarks.md has the numbers of the command above.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from groupwise.config import LoraConfig, TrainConfig
from groupwise.runtime.loading import load_tokenizer, tiny_random_model
from groupwise.training.adapters import wrap_with_lora
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence
from groupwise.training.trainer import Trainer

FAVOURED = range(100, 116)


def student_model(tokenizer, seed: int):
    """The tiny random Llama (fp64) with a rank-4 LoRA whose B is random (peft's B = 0 gives dL/dA = 0), as the
    training tests make it, its final norm x10."""
    model, _ = tiny_random_model(seed=seed, tokenizer=tokenizer, dtype=torch.float64)
    peft_model = wrap_with_lora(model, LoraConfig(rank=4, alpha=8, dropout=0.0))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.05)
        model.model.norm.weight.mul_(10.0)
    return peft_model


def teacher_model(tokenizer):
    teacher, _ = tiny_random_model(seed=7, tokenizer=tokenizer, dtype=torch.float64, hidden_size=96, num_hidden_layers=3)
    head = torch.nn.Linear(96, len(tokenizer), bias=True, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(teacher.lm_head.weight)
        head.bias.zero_()
        head.bias[FAVOURED.start:FAVOURED.stop] = 8.0
    teacher.lm_head = head
    return teacher.requires_grad_(False)


def validate(student, teacher, ids_BT) -> tuple[float, float, float]:
    """(student's mass on the favoured ids, exact KL(pi || pi_T), teacher's mass on them), per position."""
    with torch.no_grad():
        s = student(input_ids=ids_BT).logits.log_softmax(-1)
        t = teacher(input_ids=ids_BT).logits.log_softmax(-1)
    fav = s.exp()[..., FAVOURED.start:FAVOURED.stop].sum(-1).mean()
    return float(fav), float((s.exp() * (s - t)).sum(-1).mean()), float(t.exp()[..., FAVOURED.start:FAVOURED.stop].sum(-1).mean())


def run(mode: str, seed: int, steps: int, tokenizer, teacher) -> list[tuple[float, float]]:
    model = student_model(tokenizer, seed)
    trainer = Trainer(model)
    distill = {}
    if mode != "grpo":
        trainer.set_teacher(None, source="tiny-teacher", model=teacher)
        distill = dict(teacher="tiny-teacher", distill_estimate=mode, distill_top_k=16)
    config = TrainConfig(learning_rate=0.2, max_seq_len=64, micro_batch_tokens=512, max_skipped_steps=steps, **distill)
    gen = torch.Generator().manual_seed(1000 + seed)
    prompts_BT = torch.randint(3, 1000, (4, 6), generator=gen)
    held_out_BT = torch.randint(3, 1000, (4, 16), generator=gen)
    curve = [validate(model, teacher, held_out_BT)[:2]]
    for step in range(steps):
        torch.manual_seed(100 * seed + step)
        with torch.no_grad():
            out = model.generate(input_ids=prompts_BT.repeat(2, 1), attention_mask=torch.ones(8, 6, dtype=torch.long),
                                 do_sample=True, top_k=None, top_p=1.0, max_new_tokens=10, min_new_tokens=10,
                                 pad_token_id=0)
        rewards = [sum(int(t) in FAVOURED for t in row[6:]) / 10 for row in out]
        mean = statistics.fmean(rewards)
        std = statistics.pstdev(rewards)
        seqs = [TokenizedSequence(row.tolist(), [t >= 6 for t in range(16)], [math.nan] * 16,
                                  advantage=(r - mean) / (std + 1e-6), trajectory_index=i)
                for i, (row, r) in enumerate(zip(out, rewards))]
        if mode == "grpo" and std == 0:  # tied rewards: GRPO has nothing to train on (the loop skips the step)
            curve.append(curve[-1])
            continue
        trainer.train_step(TokenizedBatch(sequences=seqs, num_groups=1), config, step=step)
        curve.append(validate(model, teacher, held_out_BT)[:2])
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--modes", nargs="+", default=["grpo", "sampled", "topk"], choices=["grpo", "sampled", "topk"])
    args = parser.parse_args()
    tokenizer = load_tokenizer("smollm2-135m")
    teacher = teacher_model(tokenizer)
    probe = torch.randint(3, 1000, (4, 16), generator=torch.Generator().manual_seed(1000))
    print(f"teacher: fav {validate(teacher, teacher, probe)[2]:.4f} (its own mass on the 16 ids)")
    for mode in args.modes:
        curves = [run(mode, seed, args.steps, tokenizer, teacher) for seed in args.seeds]
        for step in range(args.steps + 1):
            fav = [c[step][0] for c in curves]
            kl = [c[step][1] for c in curves]
            print(f"{mode:8s} step {step}: fav {statistics.fmean(fav):.5f} [{min(fav):.5f}, {max(fav):.5f}]  "
                  f"kl {statistics.fmean(kl):.4f} [{min(kl):.4f}, {max(kl):.4f}]")


if __name__ == "__main__":
    main()
