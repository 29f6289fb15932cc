"""gw.fit with a rollout that never returns: LoopConfig.rollout_timeout_s ends it, it counts against
max_exceptions, and the run goes on (before, `fit` waited forever and said nothing)."""

from __future__ import annotations

import asyncio

import pytest
from loop_helpers import SCENARIOS, ScriptedBackend, make_rollout, steady_answer

import groupwise as gw


class RecordingBackend(ScriptedBackend):
    def __init__(self) -> None:
        super().__init__()
        self.exceptions: list[list[str]] = []

    async def train(self, model, groups, config, *, cursor=None):
        self.exceptions.append([e.type for g in groups for e in g.exceptions])
        return await super().train(model, groups, config, cursor=cursor)


def hanging_rollout():
    """The scripted rollout, except that the first training rollout of step 1 never returns."""
    inner = make_rollout(steady_answer)
    hung = []

    async def rollout(model, scenario):
        if not hung and "@" not in model.inference_name() and model.backend.step_of(model) == 1:
            hung.append(scenario["id"])
            await asyncio.Event().wait()
        return await inner(model, scenario)

    return rollout


async def run(tmp_path, **config):
    model = gw.TrainableModel("hung", project="loop", base_model="none", base_path=str(tmp_path))
    backend = RecordingBackend()
    await model.register(backend)
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=3, eval_every=10, patience=100,
                           rollout_timeout_s=0.3, **config)
    return await gw.fit(model, hanging_rollout(), SCENARIOS[:8], config=config), backend


async def test_a_hung_rollout_times_out_and_the_run_goes_on(tmp_path):
    summary, backend = await run(tmp_path, max_exceptions=1)
    assert summary.final_step == 3 and summary.stop.rule == "max_steps"
    assert backend.exceptions == [[], ["RolloutTimeoutError"], []]  # step 1 trained on the other 3 rollouts


async def test_a_hung_rollout_beyond_the_budget_fails_the_step_naming_the_setting(tmp_path):
    with pytest.raises(gw.GatherError, match=r"rollout_timeout_s=0\.3") as err:
        await run(tmp_path, max_exceptions=0)
    assert "LoopConfig.rollout_timeout_s" in str(err.value)
