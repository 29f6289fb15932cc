"""One-word answers: a short question, one reply, graded by its form alone.

SmolLM2-135M-Instruct, asked for one word, mostly answers in a sentence (a one-word rate near 0.1); GRPO
teaches it the format within a dozen steps on the CPU. That makes it the env whose trained policy clearly
beats its base within minutes: the quick check that training changes what the model writes, and a teacher
to distil from (bench/distill_smollm2.py --env oneword).

Reward (the scenario's `reward`): "graded", the default, is 1 / (the reply's number of words), 0 for a
reply without one: 1 for one word (punctuation and markup around it are not words), and a shorter reply
scores more even before it is one word, which keeps the variance within a group that GRPO learns from.
"exact" is 1 for one word, else 0: the sparse reward of the same task (the base rarely earns it, so most
of GRPO's groups tie), where a teacher's per-token signal has the most to add. Validation either way: the
one-word rate (the indicator of a one-word reply), over held-out questions.
"""

from __future__ import annotations

import random
import re
from typing import Any, Literal

from pydantic import Field

from groupwise.core.trajectory import Trajectory
from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory
from groupwise.envs.oneword.questions import N_TEST, N_VAL, QUESTIONS

SYSTEM_PROMPT = "Answer with exactly one word. No punctuation, no explanation."
WORD = re.compile(r"[A-Za-z0-9']+")


class ScenarioOneWord(Sampling):
    question_id: int = Field(ge=0, description="Index into questions.QUESTIONS.")
    max_tokens: int = Field(24, gt=0, description="Most tokens of the reply (a sentence fits; one word needs 1-3).")
    reward: Literal["graded", "exact"] = Field(
        "graded", description="graded: 1 / the reply's words; exact: 1 for one word, else 0 (the sparse reward).")


def reward_of(text: str, kind: Literal["graded", "exact"] = "graded") -> float:
    """graded: 1 / (the number of words of `text`), 1 for one word, 0 for a reply without a word; exact: 1
    for one word, else 0."""
    words = WORD.findall(text)
    if kind == "exact":
        return float(len(words) == 1)
    return 1.0 / len(words) if words else 0.0


async def rollout(model: Any, scenario: ScenarioOneWord) -> Trajectory:
    traj = new_trajectory(SYSTEM_PROMPT, QUESTIONS[scenario.question_id])
    traj.metadata.update({"env": "oneword", "question_id": scenario.question_id})
    choice = await complete(model, traj.messages(), scenario)
    traj.messages_and_choices.append(choice)
    text = choice_text(choice)
    words = len(WORD.findall(text))
    traj.reward = reward_of(text, scenario.reward)
    traj.metrics.update({"one_word": float(words == 1), "words": float(words)})
    return traj.finish()


def validate(trajectory: Trajectory) -> float:
    """Held-out metric: 1 for a one-word reply, else 0 (the mean is the one-word rate)."""
    return float(trajectory.metrics["one_word"])


def split_ids() -> tuple[list[int], list[int], list[int]]:
    """(train, val, test) question indices: one fixed shuffle, so every run seed validates on the same questions."""
    ids = list(range(len(QUESTIONS)))
    random.Random("oneword-split").shuffle(ids)
    return ids[N_VAL + N_TEST:], ids[:N_VAL], ids[N_VAL:N_VAL + N_TEST]


def scenarios(seed: int = 0, **overrides: Any):
    """(train, val, test): the training questions in the seed's order; val and test seeded per question
    (the same sampled replies for the same policy) and the same for every run seed."""
    train, val, test = split_ids()
    random.Random(f"oneword-train:{seed}").shuffle(train)
    make = lambda q, **kw: ScenarioOneWord(question_id=q, **{**kw, **overrides})  # noqa: E731
    return ([make(q) for q in train], [make(q, sampling_seed=10_000 + q) for q in val],
            [make(q, sampling_seed=20_000 + q) for q in test])
