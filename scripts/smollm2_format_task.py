"""SmolLM2-135M-Instruct learns a format on CPU with GRPO through LocalBackend: the end-to-end check that
training through the public API changes what the model writes.

    python scripts/smollm2_format_task.py --steps 15

The task: answer a short question with exactly ONE word. SmolLM2 usually writes a sentence. The reward
is 1 for a one-word answer, else 1 / (number of words), so a shorter answer is better even when it is
not yet one word (a graded reward keeps group variance). Before training and after every few steps,
the held-out questions are answered (greedy is avoided: the same sampling as training) and the mean
reward and the fraction of one-word answers are printed; the last line is a JSON summary.

Everything goes through the public API: TrainableModel + LocalBackend, rollouts with the openai
client against the in-process server, `model.train`. Runs in `--path` (default: a temp folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import tempfile
import time

import groupwise as gw

SYSTEM = "Answer with exactly one word. No punctuation, no explanation."
TRAIN_QUESTIONS = [
    "What color is the sky on a clear day?", "What animal says meow?", "What is the opposite of hot?",
    "What do bees make?", "Which planet do we live on?", "What is frozen water called?",
    "What fruit keeps the doctor away?", "What is the capital of France?", "What do you call a baby dog?",
    "What season comes after winter?", "What do cows drink as calves?", "Which metal is yellow and precious?",
    "What gas do plants breathe in?", "What is the largest ocean?", "What instrument has 88 keys?",
    "What do you sleep on?", "What shape has three sides?", "Which organ pumps blood?",
    "What is the color of grass?", "What do birds use to fly?",
]
VAL_QUESTIONS = [
    "What is the opposite of up?", "What animal barks?", "What color are bananas?",
    "What falls from clouds when it rains?", "What do you write with?", "What is the star at the center of our solar system?",
    "Which month comes after May?", "What do fish live in?",
]


def reward_of(text: str) -> float:
    words = re.findall(r"[A-Za-z0-9']+", text)
    if not words:
        return 0.0
    clean = len(words) == 1 and re.fullmatch(r"\s*[A-Za-z0-9']+[.!]?\s*", text) is not None
    return 1.0 if clean else 1.0 / len(words)


async def rollout(model: gw.TrainableModel, question: str, max_tokens: int, seed: int) -> gw.Trajectory:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    response = await model.openai_client().chat.completions.create(
        model=model.inference_name(), messages=messages, max_tokens=max_tokens, temperature=1.0, seed=seed
    )
    choice = response.choices[0]
    text = choice.message.content or ""
    return gw.Trajectory(
        messages_and_choices=[*messages, choice], reward=reward_of(text),
        metrics={"one_word": float(reward_of(text) == 1.0), "words": float(len(text.split()))},
    )


async def evaluate(model, args, step: int) -> dict:
    groups = await gw.gather_trajectory_groups(
        (gw.TrajectoryGroup(rollout(model, q, args.max_tokens, 10_000 + 100 * i + k) for k in range(4))
         for i, q in enumerate(VAL_QUESTIONS)),
        pbar_desc=None,
    )
    await model.log(groups, split="val")
    trajs = [t for g in groups for t in g]
    out = {
        "step": step,
        "reward": sum(t.reward for t in trajs) / len(trajs),
        "one_word": sum(t.metrics["one_word"] for t in trajs) / len(trajs),
        "example": trajs[0].messages_and_choices[-1].message.content,
    }
    print(f"[val] step {step}: reward {out['reward']:.3f}, one-word {out['one_word']:.2f}, e.g. {out['example']!r}",
          flush=True)
    return out


async def main(args) -> dict:
    path = args.path or tempfile.mkdtemp(prefix="gw-format-")
    model = gw.TrainableModel(name=f"format-{int(time.time())}", project="smollm2-format", base_model="smollm2-135m")
    backend = gw.LocalBackend(path=path, lora=gw.LoraConfig(rank=args.rank, alpha=2 * args.rank), best_checkpoint_metric=None)
    await model.register(backend)
    config = gw.TrainConfig(learning_rate=args.lr, max_seq_len=512)
    rng = random.Random(args.seed)
    before = await evaluate(model, args, 0)
    curve = []
    for step in range(args.steps):
        questions = rng.sample(TRAIN_QUESTIONS, args.groups)
        t0 = time.perf_counter()
        groups = await gw.gather_trajectory_groups(
            (gw.TrajectoryGroup(rollout(model, q, args.max_tokens, 1000 * step + 10 * i + k) for k in range(args.group_size))
             for i, q in enumerate(questions)),
            pbar_desc=None,
        )
        gen_time = time.perf_counter() - t0
        reward = sum(t.reward for g in groups for t in g) / sum(len(g) for g in groups)
        try:
            result = await model.train(groups, config=config)
            m = result.metrics
            print(f"[train] step {step}: reward {reward:.3f}  loss {m['loss']:+.4f}  grad_norm {m['grad_norm']:.3f}  "
                  f"tokens {m['trainable_tokens']:.0f}/{m['padded_tokens']:.0f}  gen {gen_time:.1f}s  "
                  f"update {m['update_time']:.1f}s  step {m['step_time']:.1f}s", flush=True)
        except gw.NotTrainableError as exc:
            print(f"[train] step {step}: reward {reward:.3f}  skipped: {str(exc)[:80]}", flush=True)
        curve.append(round(reward, 3))
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            await evaluate(model, args, await model.get_step())
    after = await evaluate(model, args, await model.get_step())
    await backend.close()
    summary = {"before": before, "after": after, "train_reward_curve": curve, "path": path}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--groups", type=int, default=2, help="questions per step")
    p.add_argument("--group-size", type=int, default=4, help="rollouts per question")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--path", default=None)
    asyncio.run(main(p.parse_args()))
