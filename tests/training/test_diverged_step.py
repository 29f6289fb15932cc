"""Through LocalBackend: a step whose update overflows the adapter fails with NonFiniteError naming the
learning rate, writes no checkpoint, leaves the trainer's adapter as it was (a multi-update SFT step
included), and the run trains on from there. Before, such a step wrote a NaN adapter, checkpointed it
as intact, and the only error was an AdapterMismatchError blaming the engine (NaN != NaN). And a
restarted run skips a checkpoint whose adapter is NaN (hashes consistent) and resumes the one before."""

from __future__ import annotations

import math

import openai
import pytest
import torch

import groupwise as gw
from groupwise.errors import ConfigError, NonFiniteError


async def _groups(model):
    client = model.openai_client()
    groups = []
    for g in range(2):
        trajs = []
        for i in range(3):
            messages = [{"role": "user", "content": f"scenario {g}"}]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages, max_tokens=4,
                                                     seed=10 * g + i)
            trajs.append(gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(i)))
        groups.append(gw.TrajectoryGroup(trajs))
    return groups


async def _state(backend):
    # clones: on CPU the worker's optimizer tensors are the live ones, which a step updates in place
    state = await backend._worker.state_tensors("p/agent")
    return {part: {k: v.clone() for k, v in state[part].items()} for part in ("adapter", "optimizer")}


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def test_a_diverging_step_fails_loudly_checkpoints_nothing_and_the_run_goes_on(tiny_model_dir, tmp_path):
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    checkpoints = tmp_path / "p" / "models" / "agent" / "checkpoints"
    try:
        groups = await _groups(model)
        assert (await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))).step == 1
        before = await _state(backend)
        # 1e39 passes the config (a finite float) but overflows the fp32 adapter's update
        with pytest.raises(NonFiniteError, match=r"step 1: .*learning_rate=1e\+39"):
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e39))
        assert await model.get_step() == 1
        assert sorted(p.name for p in checkpoints.iterdir()) == ["0001"]  # no 0002, no .tmp-*
        after = await _state(backend)
        assert _same(before["adapter"], after["adapter"]) and _same(before["optimizer"], after["optimizer"])

        # A supervised step of two updates whose second overflows: the first is undone too.
        ask = [{"role": "user", "content": "Say the code."}]
        demo = gw.Trajectory(messages_and_choices=[*ask, {"role": "assistant", "content": "zebra"}])
        with pytest.raises(NonFiniteError, match="step 1: the optimizer step overflowed"):
            await model.train_sft([demo] * 4, gw.TrainSFTConfig(learning_rate=[1e-2, 1e39], batch_size=2))
        after = await _state(backend)
        assert _same(before["adapter"], after["adapter"]) and _same(before["optimizer"], after["optimizer"])
        assert sorted(p.name for p in checkpoints.iterdir()) == ["0001"]

        # a field assigned after the config was built is checked again before the step uses it
        config = gw.TrainConfig()
        config.learning_rate = math.inf
        with pytest.raises(ConfigError, match="learning_rate=inf must be a finite number > 0"):
            await model.train(groups, config=config)
        sft_config = gw.TrainSFTConfig()
        sft_config.learning_rate = [math.nan]
        with pytest.raises(ConfigError, match=r"learning_rate\[0\]=nan must be a finite rate >= 0"):
            await model.train_sft([demo] * 2, sft_config)

        # the run trains on from the last good step
        result = await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        assert result.step == 2 and sorted(p.name for p in checkpoints.iterdir()) == ["0001", "0002"]
        r = await model.openai_client().chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.model == "agent@2"
    finally:
        await backend.close()


async def test_a_restart_skips_a_nan_checkpoint_and_resumes_the_one_before(tiny_model_dir, tmp_path):
    import hashlib
    import json

    from safetensors.torch import load_file, save

    from groupwise.errors import GroupwiseWarning

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        groups = await _groups(model)
        for _ in range(2):
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
    finally:
        await backend.close()
    # step 2's adapter as a diverged step wrote it before the finiteness checks: NaN, hashes consistent
    folder = tmp_path / "p" / "models" / "agent" / "checkpoints" / "0002"
    weights = load_file(str(folder / "adapter_model.safetensors"))
    data = save({k: torch.full_like(v, math.nan) for k, v in weights.items()})
    (folder / "adapter_model.safetensors").write_bytes(data)
    state = json.loads((folder / "state.json").read_text())
    state["files"]["adapter_model.safetensors"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / "state.json").write_text(json.dumps(state))

    again = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    clone = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    try:
        with pytest.warns(GroupwiseWarning, match="0002 is corrupt \\(its adapter holds nan or inf"):
            await clone.register(again)
        assert await clone.get_step() == 1
        adapter = (await again._worker.state_tensors("p/agent"))["adapter"]
        assert all(bool(torch.isfinite(t).all()) for t in adapter.values())
        r = await clone.openai_client().chat.completions.create(
            model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.model == "agent@1"
    finally:
        await again.close()


async def test_a_steps_trajectories_are_on_disk_before_it_fails_or_checkpoints(tiny_model_dir, tmp_path, monkeypatch):
    """The step's trajectories are written on another thread while it updates. Slowed down here (the real
    write, after a pause), they must still be on disk when a failed update's error leaves `train`, and
    before the step's checkpoint exists."""
    import threading

    from groupwise.runs.store import RunStore

    real_write = RunStore.write_trajectories
    checkpoints = tmp_path / "p" / "models" / "agent" / "checkpoints"
    seen: list[tuple[int, bool]] = []  # (step, whether the step's checkpoint existed once its write ended)
    never = threading.Event()

    def slow_write(self, split, step, groups):
        never.wait(timeout=1.0)  # the write ends a second after the update began
        path = real_write(self, split, step, groups)
        seen.append((step, (checkpoints / f"{step + 1:04d}").exists()))
        return path

    monkeypatch.setattr(RunStore, "write_trajectories", slow_write)
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        groups = await _groups(model)
        await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        stored = model.store.load_trajectories("train", 0)
        assert [t.reward for g in stored for t in g.trajectories] == [t.reward for g in groups for t in g.trajectories]
        with pytest.raises(NonFiniteError):
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e39))
        assert [len(g.trajectories) for g in model.store.load_trajectories("train", 1)] == [3, 3]
        assert seen == [(0, False), (1, False)]
        assert sorted(p.name for p in checkpoints.iterdir()) == ["0001"]
    finally:
        await backend.close()


async def test_a_step_that_fails_after_its_update_blocks_the_next_until_the_run_is_loaded_again(
        tiny_model_dir, tmp_path, monkeypatch):
    """The disk fills while step 1 checkpoints: its update ran, no checkpoint has it. Training on would
    build on weights no history explains, so the next step is refused, with what to do; loading the run
    again restores the adapter and optimizer of the last checkpoint, and the step trains from there."""
    import errno

    from groupwise.errors import DiskFullError, StoreError
    from groupwise.training import checkpoint

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        groups = await _groups(model)
        await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        saved = await _state(backend)

        def disk_full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(checkpoint, "_save", disk_full)
        with pytest.raises(DiskFullError, match="load the run again"):
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        monkeypatch.undo()
        moved = await _state(backend)
        assert not _same(saved["adapter"], moved["adapter"])  # the update ran
        # it was served while its checkpoint was written; no checkpoint holds it, so nothing answers with it
        for name in ("agent", "agent@2"):
            with pytest.raises(openai.NotFoundError):
                await model.openai_client().chat.completions.create(
                    model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        with pytest.raises(StoreError, match=r"step 1's update ran, .*DiskFullError.*unregister\(model\)"):
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        demo = gw.Trajectory(messages_and_choices=[{"role": "user", "content": "Say it."},
                                                   {"role": "assistant", "content": "it"}])
        with pytest.raises(StoreError, match="step 1's update ran"):
            await model.train_sft([demo], gw.TrainSFTConfig(learning_rate=1e-3))

        await backend.unregister(model)
        await model.register(backend)
        assert await model.get_step() == 1
        reloaded = await _state(backend)
        assert _same(saved["adapter"], reloaded["adapter"]) and _same(saved["optimizer"], reloaded["optimizer"])
        assert (await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))).step == 2
    finally:
        await backend.close()


async def test_a_failed_check_is_the_error_raised_and_a_write_failing_beside_it_is_logged(
        tiny_model_dir, tmp_path, monkeypatch, caplog):
    """The checkpoint is written while the new adapter is served and checked: when both fail, the check's
    error is raised (it says what the rollouts would have sampled) and the write's is logged, not lost."""
    import errno
    import logging

    from groupwise.errors import AdapterMismatchError
    from groupwise.training import checkpoint

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        groups = await _groups(model)

        def disk_full(*args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        def mismatch(step):
            raise AdapterMismatchError(f"after step {step} the engine's adapter does not hold the trained weights")

        monkeypatch.setattr(checkpoint, "_save", disk_full)
        monkeypatch.setattr(backend._worker.replicas["p/agent"], "check_adapter", mismatch)
        with caplog.at_level(logging.ERROR, logger="groupwise.backend"):
            with pytest.raises(AdapterMismatchError, match="after step 1"):
                await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        assert any("step 1's checkpoint was not written either" in r.getMessage() and "the disk is full" in r.getMessage()
                   for r in caplog.records), caplog.text
    finally:
        await backend.close()


async def test_a_group_changed_after_it_was_built_is_refused_before_the_update_or_stored(tiny_model_dir, tmp_path):
    """Values a rollout sets into a built trajectory are not seen by pydantic. A numpy metric set so
    (``t.metrics["acc"] = np.float32(...)``) reached the writer, which failed after the update: the
    step's trajectories were lost and the run refused every step until it was loaded again. A None
    metric failed the history row the same way. Now the numpy value is stored as a number, and the
    None is refused before anything is updated or written; the run trains on."""
    import numpy as np

    from groupwise.errors import StoreError

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    run_dir = tmp_path / "p" / "models" / "agent"
    try:
        groups = await _groups(model)
        before = await _state(backend)
        groups[1].trajectories[2].metrics["acc"] = None
        with pytest.raises(StoreError, match=r"groups\[1\]\.trajectories\[2\]\.metrics\.acc: .*set after"):
            await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        assert await model.get_step() == 0 and not (run_dir / "trajectories").exists()
        after = await _state(backend)
        assert _same(before["adapter"], after["adapter"]) and _same(before["optimizer"], after["optimizer"])

        for n, t in enumerate(groups[1].trajectories):
            t.metrics["acc"] = np.float32(n / 2)
        assert (await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))).step == 1
        [row] = [r for r in model.store.history() if r["split"] == "train"]
        assert row["acc"] == 0.5  # (0 + 0.5 + 1) / 3
        stored = gw.load_trajectories(run_dir, "train", 0)
        assert [t.metrics["acc"] for t in stored[1].trajectories] == [0.0, 0.5, 1.0]
        assert (await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))).step == 2
    finally:
        await backend.close()
