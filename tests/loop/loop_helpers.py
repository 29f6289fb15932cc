"""Builders for the loop tests: synthetic histories, groups, and a scripted backend.

`ScriptedBackend` implements the `Backend` interface without a model: a "training step" only advances
a step counter kept in the run's state.json, with the loop's data cursor (so a second process sees
them, as with real checkpoints).
`scripted_rollout` answers from a script keyed by the policy step it is asked for, which lets a test
decide exactly how reward and validation move.

Run as a script (``python loop_helpers.py BASE_PATH KILL_AT_STEP``) it trains a scripted run and
SIGKILLs itself in the middle of step KILL_AT_STEP: the resume test's crash.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
from pathlib import Path

import groupwise as gw
from groupwise.backend.base import Backend, InferenceEndpoint, TrainResult
from groupwise.core.trajectory import Trajectory, TrajectoryGroup


def history(train=(), val=None, metric="accuracy", lengths=None, baselines=None, reward_std=0.1,
            val_ci=None, n_trajectories=None):
    """History rows: train rewards at steps 0.., val {step: value}, baselines {name: value}.

    val_ci {step: (lo, hi)} gives validations their confidence interval; n_trajectories gives each
    train row its rollout count, so its mean reward has a noise (reward_std / sqrt(n))."""
    rows = []
    for step, r in enumerate(train):
        row = {"step": step, "split": "train", "reward": r, "reward_std": reward_std}
        if n_trajectories is not None:
            row["n_trajectories"] = n_trajectories
        if lengths is not None:
            row["answer_chars"] = lengths[step]
        rows.append(row)
    for step, v in (val or {}).items():
        row = {"step": step, "split": "val", metric: v, "reward": v}
        if val_ci and step in val_ci:
            row[f"{metric}_lo"], row[f"{metric}_hi"] = val_ci[step]
        rows.append(row)
    for name, v in (baselines or {}).items():
        rows.append({"step": 0, "split": "baseline", "name": name, metric: v})
    return rows


def traj(answer: str, reward: float = 0.0, question: str = "q", **metrics) -> Trajectory:
    return Trajectory(
        messages_and_choices=[{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
        reward=reward, metrics=metrics,
    )


def group(answers, rewards=None, **metadata) -> TrajectoryGroup:
    rewards = rewards if rewards is not None else [0.0] * len(answers)
    return TrajectoryGroup([traj(a, r) for a, r in zip(answers, rewards)], metadata=metadata)


HEALTHY_ANSWERS = [
    "The capital of France is Paris.", "Paris, on the Seine.", "It is Paris, I believe.",
    "France's capital city is Paris.",
]


class ScriptedBackend(Backend):
    """A Backend with no model: train() advances a step counter stored in the run's state.json."""

    def __init__(self) -> None:
        self.kept_best: list[int] = []
        self.served: list[int] = []
        self.trained_on: list[list[int]] = []

    async def register(self, model) -> None:
        pass

    def inference_endpoint(self, model) -> InferenceEndpoint:
        return InferenceEndpoint(base_url="http://scripted.invalid/v1", api_key="none")

    def step_of(self, model) -> int:
        return int(model.store.read_state().get("scripted_step", 0))

    async def train(self, model, groups, config, *, cursor=None) -> TrainResult:
        self.trained_on.append([g.metadata["scenario_index"] for g in groups])
        step = self.step_of(model) + 1
        model.store.write_state({**model.store.read_state(), "scripted_step": step, "cursor": cursor or {}})
        return TrainResult(step=step, metrics={"loss": 0.5})

    async def get_step(self, model) -> int:
        return self.step_of(model)

    async def checkpoint_cursor(self, model) -> dict:
        return dict(model.store.read_state().get("cursor", {}))

    async def serve_step(self, model, step) -> None:
        self.served.append(step)

    async def keep_best(self, model, best_step, *, metrics_by_step=None, maximize=True) -> None:
        self.kept_best.append(best_step)


def policy_step(model) -> int:
    """The step a rollout's requests go to: name@k, or the latest step for the plain name."""
    if not model.trainable:  # a prompted baseline
        return -1
    name = model.inference_name()
    if "@" in name:
        return int(name.rsplit("@", 1)[1])
    return model.backend.step_of(model)


SPREAD = 1e-6  # make_rollout's reward spread within a group (rewards closer than 1e-9 tie)


def make_rollout(answer_for, log_path: Path | None = None, kill_at: int | None = None, spread: float = SPREAD):
    """A rollout answering `answer_for(step, scenario) -> (text, reward)`; logs "step scenario" lines;
    SIGKILLs the process at the first train rollout of step `kill_at`.

    The rollouts of a (step, scenario) get `spread` more and `spread` less reward in turn (a group of
    an even size keeps its mean), so each scripted group has a learning signal as real rollouts do: a step whose groups all tie is gathered again, stopped on or
    skipped (`groupwise.core.learning_signal`), which the tests of that rule ask for with spread=0."""
    seen: dict[tuple[int, str, int], int] = {}

    async def rollout(model, scenario):
        step = policy_step(model)
        at_step = "@" in model.inference_name()
        if kill_at is not None and step == kill_at and not at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if log_path is not None and not at_step:
            with open(log_path, "a") as f:
                f.write(f"{step} {scenario['id']}\n")
        text, reward = answer_for(step, scenario)
        key = (step, model.inference_name(), scenario["id"])
        seen[key] = seen.get(key, 0) + 1
        reward += spread if seen[key] % 2 else -spread  # before the await: a group's rollouts run concurrently
        await asyncio.sleep(0)
        return traj(text, reward, question=scenario["q"])

    return rollout


SCENARIOS = [{"id": i, "q": f"question {i}", "answer": str(i)} for i in range(12)]


_tries = itertools.count()


def steady_answer(step, scenario):
    # Reward and correctness both improve with the step (a healthy run); every rollout's text differs.
    return (f"answer {scenario['answer']} after {step} steps (try {next(_tries)})", min(1.0, 0.1 * step))


def steady_validate(trajectory, scenario):
    # correctness 0.2 + 0.1 * (the step that answered): rises every validation
    step = int(trajectory.messages()[-1]["content"].split(" after ")[1].split()[0])
    return round(0.2 + 0.1 * step, 6)


async def run_scripted(base_path: str, *, kill_at: int | None = None, log_path: Path | None = None,
                       config: gw.LoopConfig | None = None):
    model = gw.TrainableModel("scripted", project="loop", base_model="none", base_path=base_path)
    backend = ScriptedBackend()
    await model.register(backend)
    rollout = make_rollout(steady_answer, log_path=log_path, kill_at=kill_at)
    config = config or gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=6,
                                     patience=100, num_epochs=2)
    summary = await gw.fit(model, rollout, SCENARIOS[:8], val_scenarios=SCENARIOS[8:10],
                           validate=steady_validate,
                           config=config)
    return summary, backend


if __name__ == "__main__":
    asyncio.run(run_scripted(sys.argv[1], kill_at=int(sys.argv[2]), log_path=Path(sys.argv[3])))
    print(json.dumps({"finished": True}))
