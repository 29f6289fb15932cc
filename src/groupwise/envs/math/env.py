"""Math word problems and arithmetic for an LLM agent: one question, one reply, graded exactly.

The agent is asked to end with ``Answer: <number>``; `grader.parse_answer` reads the final answer
(boxed, after an "Answer:" marker, or else the last number; see its docstring for what is rejected).
Reward: 1.0 when the answer equals the exact integer, else 0.0. `validate` is the same indicator,
so its mean over held-out problems is the accuracy.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory, split_seeds
from groupwise.envs.math.grader import parse_answer
from groupwise.envs.math.problems import EASIEST, HARDEST, make_problem
from groupwise.core.trajectory import Trajectory

SYSTEM_PROMPT = (
    "Solve the problem. Think briefly if you need to, then end your reply with the final answer "
    "as a number in this format: Answer: 42"
)


class ScenarioMath(Sampling):
    seed: int = Field(description="Which problem (with `level`, it determines question and answer).")
    level: int = Field(EASIEST, ge=EASIEST, le=HARDEST, description="Difficulty 1..3 (see problems.py).")
    strict: bool = Field(False, description="Only accept boxed or 'Answer:' answers (no last-number fallback).")
    max_tokens: int = Field(48, gt=0, description="Most tokens of the reply.")


async def rollout(model: Any, scenario: ScenarioMath) -> Trajectory:
    problem = make_problem(scenario.seed, scenario.level)
    traj = new_trajectory(SYSTEM_PROMPT, problem.question)
    traj.metadata.update(
        {"env": "math", "seed": scenario.seed, "level": scenario.level, "kind": problem.kind, "answer": str(problem.answer)}
    )
    choice = await complete(model, traj.messages(), scenario)
    traj.messages_and_choices.append(choice)
    parsed = parse_answer(choice_text(choice), strict=scenario.strict)
    correct = parsed is not None and parsed == problem.answer
    traj.metadata["parsed_answer"] = None if parsed is None else str(parsed)
    traj.reward = 1.0 if correct else 0.0
    traj.metrics.update({"correct": float(correct), "answered": float(parsed is not None)})
    return traj.finish()


def validate(trajectory: Trajectory) -> float:
    """Held-out metric: 1 for a correct final answer, else 0 (the mean is the accuracy)."""
    return float(trajectory.metrics["correct"])


def scenarios(seed: int = 0, *, n_train: int = 1000, n_val: int = 48, n_test: int = 200, **overrides: Any):
    """(train, val, test) problems at level 1 by default; val/test are the same for every run seed."""
    train, val, test = split_seeds(seed, n_train, n_val, n_test, offset=7)
    make = lambda s, **kw: ScenarioMath(seed=s, **{**kw, **overrides})  # noqa: E731
    return (
        [make(s) for s in train],
        [make(s, sampling_seed=s) for s in val],
        [make(s, sampling_seed=s) for s in test],
    )
