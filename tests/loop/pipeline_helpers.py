"""A scripted pipelined run (`LoopConfig.max_steps_off_policy`) for the pipeline tests.

Run as a script (``python pipeline_helpers.py BASE_PATH KILL_AT_STEP LOG``) it SIGKILLs itself at the
first validation rollout of step KILL_AT_STEP, while the batches of the next steps are being gathered
ahead. (Not in a training rollout: those run beside `model.train`, and the scripted backend, unlike the
real ones, does not save the step's history row with its step counter, so a kill between the two would
lose the row; backend/driver.py replays it from the checkpoint.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from loop_helpers import SCENARIOS, ScriptedBackend, steady_answer, steady_validate, traj

import groupwise as gw

TRAIN, VAL = SCENARIOS[:8], SCENARIOS[8:10]


def pinned_rollout(log_path: Path | None = None, kill_at: int | None = None):
    """Answers as `steady_answer` at the policy version it is handed (``name@v``), logs "v scenario" for
    training rollouts, and spreads rewards within a group (seeded: the same rollout always scores the same)."""
    seen: dict[tuple[int, int], int] = {}

    async def rollout(model, scenario):
        name = model.inference_name()
        version = int(name.rsplit("@", 1)[1]) if "@" in name else model.backend.step_of(model)
        training = scenario["id"] < len(TRAIN)
        if not training and kill_at is not None and version == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if training and log_path is not None:
            with open(log_path, "a") as f:
                f.write(f"{version} {scenario['id']}\n")
        text, reward = steady_answer(version, scenario)
        text = text.split(" (try")[0]  # deterministic text: the history compares equal across runs
        key = (version, scenario["id"])
        seen[key] = seen.get(key, 0) + 1  # before the await: a group's two rollouts get +0.01 and -0.01
        reward += 0.01 if seen[key] % 2 else -0.01
        text += " (first)" if seen[key] % 2 else " (second)"  # answers differ within a group, as sampled ones do
        await asyncio.sleep(0.001 * (scenario["id"] % 3))  # rollouts finish out of order
        return traj(text, reward, question=scenario["q"])

    return rollout


def config(**kw) -> gw.LoopConfig:
    return gw.LoopConfig(**{"rollouts_per_group": 2, "groups_per_step": 2, "eval_every": 2, "max_steps": 6,
                            "patience": 100, "num_epochs": 2, "max_steps_off_policy": 2, **kw})


async def run(base_path: str, *, log_path: Path | None = None, kill_at: int | None = None, **kw):
    model = gw.TrainableModel("piped", project="loop", base_model="none", base_path=base_path)
    backend = ScriptedBackend()
    await model.register(backend)
    summary = await gw.fit(model, pinned_rollout(log_path, kill_at), TRAIN, val_scenarios=VAL,
                           validate=steady_validate, config=config(**kw))
    return summary, backend


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], kill_at=int(sys.argv[2]), log_path=Path(sys.argv[3])))
    print(json.dumps({"finished": True}))
