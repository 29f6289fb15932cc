"""gw.fit of several runs at once (loop/sweep.py), against the scripted backend: each run's history is the
one it writes alone; a run whose rollouts crash or whose detector stops it ends alone; each step line
names its run. (The shared engine and base weights are tested with real models in
tests/backend/test_many_runs.py.)"""

from __future__ import annotations

import logging

import pytest
from history_rows import stable_rows
from loop_helpers import SCENARIOS, ScriptedBackend, make_rollout, steady_validate

import groupwise as gw
from groupwise.errors import ConfigError, GatherError


def steady(step, scenario):
    return f"answer {scenario['answer']} after {step} steps", min(1.0, 0.1 * step)


def gamed(step, scenario):
    """From step 3 the answer pads itself and loses the number: val_drop stops the run at step 4."""
    if step <= 2:
        return f"answer {scenario['answer']}", 0.1 * step
    return "very long answer " * step, 0.1 * step + 0.5


def exact(trajectory, scenario) -> float:
    return float(trajectory.messages()[-1]["content"] == f"answer {scenario['answer']}")


def crashing(step, scenario):
    if step == 2:
        raise RuntimeError("the environment crashed")
    return steady(step, scenario)


CONFIG = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=6, patience=100,
                       num_epochs=2, max_exceptions=0)
PLANS = {"healthy": (steady, steady_validate), "gamed": (gamed, exact), "crashes": (crashing, steady_validate)}


def _run(name: str, path) -> gw.FitRun:
    model = gw.TrainableModel(name, project="sweep", base_model="none", base_path=str(path))
    answer, validate = PLANS[name]
    return gw.FitRun(model, make_rollout(answer), SCENARIOS[:8], val_scenarios=VAL, validate=validate, config=CONFIG)


# Eight validation prompts: the gamed run's fall from all right to all wrong is beyond val_drop's noise band.
VAL = [{"id": 100 + i, "q": f"question {100 + i}", "answer": str(100 + i)} for i in range(8)]


def _rows(run_dir) -> list[dict]:
    return stable_rows(gw.load_history(run_dir))


async def test_runs_at_once_each_write_the_history_they_write_alone_and_a_broken_one_ends_alone(tmp_path, caplog):
    backend = ScriptedBackend()
    runs = [_run(name, tmp_path / "together") for name in PLANS]
    for r in runs:
        await r.model.register(backend)
    with caplog.at_level(logging.INFO, logger="groupwise.loop"):
        results = dict(zip(PLANS, await gw.fit_runs(runs)))
    assert results["healthy"].stop.rule == "max_steps" and results["healthy"].final_step == 6
    assert results["gamed"].stop.rule == "alert:val_drop" and results["gamed"].final_step == 4
    assert isinstance(results["crashes"], GatherError)
    # every line the loop logged names its run, and each run logged its own steps
    lines = [r.getMessage() for r in caplog.records if r.name == "groupwise.loop"]
    assert lines and all(line.startswith(("[healthy] ", "[gamed] ", "[crashes] ")) for line in lines)
    assert [line.split(" · ")[0] for line in lines if line.startswith("[healthy] step") and "/" in line] == \
        [f"[healthy] step {s}/6" for s in range(1, 7)]
    assert any(line.startswith("[gamed] step 4/6") for line in lines)
    # each run's history is what it writes alone: the others neither stopped it nor wrote into it
    for name in PLANS:
        alone = ScriptedBackend()
        run = _run(name, tmp_path / "alone")
        await run.model.register(alone)
        try:
            await gw.fit(run.model, run.rollout, run.train_scenarios, val_scenarios=run.val_scenarios,
                         validate=run.validate, config=run.config)
        except GatherError:
            assert name == "crashes"
        assert _rows(tmp_path / "together" / "sweep" / "models" / name) == _rows(tmp_path / "alone" / "sweep" / "models" / name), name


async def test_fit_takes_several_models_with_one_config_each(tmp_path):
    backend = ScriptedBackend()
    models = [gw.TrainableModel(f"lr{i}", project="sweep", base_model="none", base_path=str(tmp_path)) for i in range(2)]
    for m in models:
        await m.register(backend)
    configs = [gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=steps, eval_every=2, patience=100)
               for steps in (2, 4)]
    summaries = await gw.fit(models, make_rollout(steady), SCENARIOS[:8], val_scenarios=SCENARIOS[8:10],
                             validate=steady_validate, config=configs)
    assert [(s.run_dir.rsplit("/", 1)[1], s.final_step) for s in summaries] == [("lr0", 2), ("lr1", 4)]
    with pytest.raises(ConfigError, match="3 configs for 2 models"):
        await gw.fit(models, make_rollout(steady), SCENARIOS[:8], config=configs + configs[:1])
    with pytest.raises(ConfigError, match="appear in several runs"):
        await gw.fit([models[0], models[0]], make_rollout(steady), SCENARIOS[:8])


async def _order(tmp_path, lockstep: bool) -> list[tuple[str, str, int]]:
    """(event, run, step) in the order they happened: a run's first rollout of each step ("gather") and its
    updates ("train"); the run "slow" takes longer for every rollout than "fast"."""
    import asyncio
    import dataclasses

    from loop_helpers import policy_step

    events: list[tuple[str, str, int]] = []

    class Recording(ScriptedBackend):
        async def train(self, model, groups, config, *, cursor=None):
            result = await super().train(model, groups, config, cursor=cursor)
            events.append(("train", model.name, result.step - 1))
            return result

    fast_reached_step_3 = asyncio.Event()

    def timed(name: str, delay: float):
        inner = make_rollout(steady)

        async def rollout(model, scenario):
            step = policy_step(model)
            if "@" not in model.inference_name() and ("gather", name, step) not in events:
                events.append(("gather", name, step))
                if (name, step) == ("fast", 3):
                    fast_reached_step_3.set()
            await asyncio.sleep(delay)
            if name == "slow" and step >= 1 and not lockstep:
                # Free-running, "slow" stalls at step 1 until "fast" is at step 3; on a loaded machine timing
                # alone does not order them. Were the runs in lockstep after all, "fast" could never get
                # there: the wait runs out and the order assertion fails.
                try:
                    await asyncio.wait_for(fast_reached_step_3.wait(), timeout=30)
                except asyncio.TimeoutError:
                    pass
            return await inner(model, scenario)

        return rollout

    backend = Recording()
    config = dataclasses.replace(CONFIG, lockstep=lockstep, max_steps=4)
    runs = []
    for name, delay in (("fast", 0.0), ("slow", 0.02)):
        model = gw.TrainableModel(name, project="lockstep", base_model="none", base_path=str(tmp_path / str(lockstep)))
        await model.register(backend)
        runs.append(gw.FitRun(model, timed(name, delay), SCENARIOS[:8], config=config))
    results = await gw.fit_runs(runs)
    assert all(r.final_step == 4 for r in results)
    return events


async def test_a_sweeps_runs_start_each_steps_rollouts_together_unless_told_not_to(tmp_path):
    # LoopConfig.lockstep (loop/lockstep.py): the engine the runs share then samples their rollouts in one batch.
    events = await _order(tmp_path, lockstep=True)
    for step in range(1, 4):
        starts = [events.index(("gather", run, step)) for run in ("fast", "slow")]
        trained = [events.index(("train", run, step - 1)) for run in ("fast", "slow")]
        assert min(starts) > max(trained), events  # no run begins step k before every run has trained step k-1
    # free-running, the fast run is steps ahead of the slow one
    events = await _order(tmp_path, lockstep=False)
    assert events.index(("gather", "fast", 3)) < events.index(("train", "slow", 1)), events
