"""A run trained under groupwise's earlier layout (``<path>/<project>/<name>``) resumes under ART's
(``<path>/<project>/models/<name>``): its checkpoints, history and trajectories move with it intact,
and ART's path helpers then find its adapter where ART puts one."""

from __future__ import annotations

from pathlib import Path

import groupwise as gw
import groupwise.runs.store as store_module
from groupwise.runs.output_dirs import get_model_dir, get_step_checkpoint_dir


async def _groups(model, step: int) -> list[gw.TrajectoryGroup]:
    client = model.openai_client()
    groups = []
    for g in range(2):
        trajs = []
        for i in range(3):
            messages = [{"role": "user", "content": f"scenario {g}"}]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages,
                                                     max_tokens=4, seed=100 * step + 10 * g + i)
            trajs.append(gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(i)))
        groups.append(gw.TrajectoryGroup(trajs))
    return groups


async def test_an_earlier_layout_run_resumes_with_its_history_and_trajectories(tiny_model_dir, tmp_path, monkeypatch):
    # the earlier layout, as the code before ART's layout made it: the run's folder one level higher
    monkeypatch.setattr(store_module, "run_dir_of", lambda base, project, name: Path(base) / project / name)
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    try:
        await model.register(backend)
        groups = await _groups(model, 0)
        await model.log(groups[:1], split="val")
        await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        assert await model.get_step() == 1
    finally:
        await backend.close()
    legacy = tmp_path / "p" / "agent"
    assert (legacy / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
    history = gw.load_history(legacy)
    trajectories = gw.load_trajectories(legacy)
    monkeypatch.undo()

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    try:
        await model.register(backend)
        run = tmp_path / "p" / "models" / "agent"
        assert model.run_dir == run and not legacy.exists()
        assert await model.get_step() == 1  # resumed from the moved checkpoint
        assert gw.load_history(run) == history and gw.load_trajectories(run) == trajectories
        # ART's helpers, as a program calls them, find the adapter in peft's format
        checkpoint = Path(get_step_checkpoint_dir(get_model_dir(model, str(tmp_path)), 1))
        assert {"adapter_model.safetensors", "adapter_config.json"} <= {p.name for p in checkpoint.iterdir()}
        result = await model.train(await _groups(model, 1), config=gw.TrainConfig(learning_rate=1e-3))
        assert result.step == 2 and (run / "checkpoints" / "0002" / "state.json").is_file()
        train_steps = [r["step"] for r in gw.load_history(run) if r["split"] == "train"]
        assert train_steps == [0, 1]
        assert [(split, step) for split, step, _ in store_module.trajectory_files(run)] == \
            [("train", 0), ("train", 1), ("val", 0)]
    finally:
        await backend.close()
