"""A tiny random model learns: GRPO raises a reward that is a property of the sampled text.

Measured (seed 0): the newline fraction goes from 0.12 (mean of steps 0-2) to 0.38 (steps 7-9).
"""

from __future__ import annotations

import torch
from gw_train_helpers import sample_choices

from groupwise.config import LoraConfig, TrainConfig
from groupwise.training.tokenize import tokenize_groups
from groupwise.training.adapters import wrap_with_lora
from groupwise.training.trainer import Trainer
from groupwise.core.trajectory import Trajectory, TrajectoryGroup


def test_tiny_model_learns_to_prefer_a_token_set(tokenizer):
    from groupwise.runtime.loading import tiny_random_model

    torch.manual_seed(0)
    model, _ = tiny_random_model(seed=0, tokenizer=tokenizer)
    model = wrap_with_lora(model, LoraConfig(rank=8, alpha=16))
    trainer = Trainer(model, pad_token_id=tokenizer.pad_token_id)
    config = TrainConfig(learning_rate=1e-2, max_seq_len=256)

    def reward(choice) -> float:
        # the fraction of newlines in the sampled text (about 0.1 at random init)
        return choice.message.content.count("\n") / len(choice.token_ids)

    prompts = [[{"role": "user", "content": p}] for p in ("count", "go", "write")]
    curve = []
    for step in range(10):
        groups = []
        for messages in prompts:
            choices = sample_choices(model, tokenizer, messages, n=6, max_new_tokens=8, top_k=4)
            groups.append(TrajectoryGroup(
                Trajectory(messages_and_choices=[*messages, c], reward=reward(c)) for c in choices
            ))
        curve.append(sum(t.reward for g in groups for t in g) / sum(len(g) for g in groups))
        batch = tokenize_groups(groups, tokenizer, max_seq_len=config.max_seq_len)
        trainer.train_step(batch, config, step=step)
    first, last = sum(curve[:3]) / 3, sum(curve[-3:]) / 3
    print("reward curve:", [round(r, 3) for r in curve])
    # A random model spreads its logits thinly over 49k tokens; top_k=4 sampling (an engine setting,
    # the logprobs stay the policy's own) makes the competing tokens real alternatives to learn from.
    assert first < 0.2, curve
    assert last > first + 0.15, curve
