"""One identity per run (groupwise/runs/run_id.py): two models of one name in two projects are two runs.

Registered on one backend, `TrainableModel(name="agent", project="p1")` and `(name="agent", project="p2")`
train as separate runs: each keeps its own adapter, steps, checkpoints, history and trajectories, and the
openai client reaches each by `model.inference_name()` (the qualified ``p1/agent`` while the name is
shared); a bare ``agent`` that two runs share is refused naming both, never answered by a guess. A run of
another store with the same project and name is refused at register, naming both folders.
"""

from __future__ import annotations

import openai
import pytest

import groupwise as gw
from groupwise.errors import ModelNotFoundError
from groupwise.inference.registry import ModelRegistry
from groupwise.runs.run_id import RunId

pytest.importorskip("torch")
pytest.importorskip("peft")

STEPS = 2


def _backend(path) -> gw.LocalBackend:
    return gw.LocalBackend(path=str(path), device="cpu", best_checkpoint_metric=None, serve_http=False,
                           engine_kwargs={"batch_invariant": True})


async def _groups(model, step: int, reward_of) -> list[gw.TrajectoryGroup]:
    client = model.openai_client()
    groups = []
    for g in range(2):
        trajectories = []
        for i in range(4):
            messages = [{"role": "user", "content": f"Topic {g}."}]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages, max_tokens=5,
                                                     temperature=1.0, seed=100 * step + 10 * g + i)
            # the answer names the run's adapter of this step: its own, under the name it was asked by
            assert r.model == model.inference_name(step)
            trajectories.append(gw.Trajectory(messages_and_choices=[*messages, r.choices[0]],
                                              reward=reward_of(r.choices[0].message.content or "", i)))
        groups.append(gw.TrajectoryGroup(trajectories))
    return groups


async def test_two_projects_models_of_one_name_train_as_two_runs_on_one_backend(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    backend = _backend(tmp_path)
    one = gw.TrainableModel(name="agent", project="p1", base_model=tiny_model_dir)
    two = gw.TrainableModel(name="agent", project="p2", base_model=tiny_model_dir)
    await one.register(backend)
    assert one.inference_name() == "agent"  # alone, the name ART's clients use
    await two.register(backend)
    try:
        assert (one.inference_name(), two.inference_name(1)) == ("p1/agent", "p2/agent@1")
        with pytest.raises(openai.NotFoundError, match=r"names 2 runs.*p1/agent.*p2/agent"):
            await one.openai_client().chat.completions.create(
                model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        # different rewards and rates: each run's adapter moves its own way
        for step in range(STEPS):
            await one.train(await _groups(one, step, lambda text, i: float(i)),
                            config=gw.TrainConfig(learning_rate=1e-2))
            await two.train(await _groups(two, step, lambda text, i: float(-i)),
                            config=gw.TrainConfig(learning_rate=3e-2))
        assert (await one.get_step(), await two.get_step()) == (STEPS, STEPS)  # not one run of 2 * STEPS steps
        assert sorted(backend.describe()["models"].items()) == [("p1/agent", STEPS), ("p2/agent", STEPS)]
        await backend.unregister(two)
        assert one.inference_name() == "agent"  # the name is its own again
    finally:
        await backend.close()
    for model in (one, two):
        rows = [r for r in gw.load_history(model.run_dir) if r["split"] == "train"]
        assert [r["step"] for r in rows] == list(range(STEPS))
        folders = sorted(p.name for p in (model.run_dir / "checkpoints").iterdir() if p.name.isdigit())
        assert folders == [f"{s:04d}" for s in range(1, STEPS + 1)]
        for step in range(STEPS):
            groups = gw.load_trajectories(model.run_dir, "train", step)
            assert len(groups) == 2 and all(len(g.trajectories) == 4 for g in groups)
    # the first run's rewards rise with i, the second's fall: each store holds its own rollouts only
    assert [t.reward for t in gw.load_trajectories(one.run_dir, "train", 0)[0].trajectories] == [0.0, 1.0, 2.0, 3.0]
    assert [t.reward for t in gw.load_trajectories(two.run_dir, "train", 0)[0].trajectories] == [0.0, -1.0, -2.0, -3.0]
    last = [load_file(str(m.run_dir / "checkpoints" / f"{STEPS:04d}" / "adapter_model.safetensors")) for m in (one, two)]
    assert last[0].keys() == last[1].keys()
    assert any(not (last[0][k] == last[1][k]).all() for k in last[0])


async def test_a_run_of_another_store_with_the_same_project_and_name_is_refused(tiny_model_dir, tmp_path):
    backend = _backend(tmp_path / "a")
    here = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    there = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir, base_path=str(tmp_path / "b"))
    again = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)  # the same folder: the same run
    await here.register(backend)
    try:
        with pytest.raises(gw.ConfigError, match=r"(?s)in .*b/p/models/agent.*already registered.*in .*a/p/models/agent"):
            await there.register(backend)
        await again.register(backend)
        assert RunId.of(again) == RunId.of(here) and await again.get_step() == 0
        assert list(backend.describe()["models"]) == ["p/agent"]
    finally:
        await backend.close()


def test_the_registry_answers_a_short_name_only_while_one_run_has_it():
    registry = ModelRegistry(engine=None)  # names only: no step is loaded
    registry.register_model("p1/agent", short="agent")
    assert registry.resolve("agent").served_as == "agent@0"
    assert registry.resolve("p1/agent@0").served_as == "p1/agent@0"
    assert registry.served_ids() == ["agent", "agent@0"]
    registry.register_model("p2/agent", short="agent")
    with pytest.raises(ModelNotFoundError, match=r"names 2 runs served here: \['p1/agent', 'p2/agent'\]"):
        registry.resolve("agent@0")
    assert registry.resolve("p2/agent").follow == "p2/agent"
    assert registry.served_ids() == ["p1/agent", "p1/agent@0", "p2/agent", "p2/agent@0"]
    registry.unregister_model("p1/agent")
    assert registry.resolve("agent").follow == "p2/agent"
    # a project folder may hold an '@': the step is read after the run's name
    registry.register_model("team@x/bot", short="bot")
    assert registry.resolve("team@x/bot@0").step == 0 and registry.resolve("team@x/bot").follow == "team@x/bot"
    with pytest.raises(gw.ConfigError, match="must not contain '@'"):
        registry.register_model("p/a@b")
