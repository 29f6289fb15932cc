"""Joint updates on a real backend (backend/joint_updates.py): runs of one base whose updates wait at the same
time train in one pass, and each gets the update it gets alone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from backend_helpers import sample_groups
from safetensors.torch import load_file

import groupwise as gw
from groupwise.errors import ConfigError

RUNS = 3
STEPS = 3


async def _train(tiny_model_dir: str, path: Path, *, joint: bool | None, groups_by_step=None, engine_process="in_process"):
    """Three runs of one base on one LocalBackend, each step's updates sent at once (as a lockstep sweep's
    runs do). Returns (each step's rollout groups per run, each run's final adapter, each step's joint_runs
    per run, the worker's passes). `joint` None leaves joint_updates at its default."""
    chosen = {} if joint is None else {"joint_updates": joint}
    backend = gw.LocalBackend(path=str(path), device="cpu", engine_process=engine_process, **chosen)
    models = [gw.TrainableModel(f"run{k}", project="joint", base_model=tiny_model_dir) for k in range(RUNS)]
    configs = [gw.TrainConfig(learning_rate=1e-2 * (k + 1), seed=k) for k in range(RUNS)]
    sampled, joined = [], []
    try:
        for m in models:
            await m.register(backend)
        for step in range(STEPS):
            if groups_by_step is None:
                groups = [await sample_groups(m, step=step, n_groups=k + 1) for k, m in enumerate(models)]
            else:
                groups = groups_by_step[step]
            sampled.append(groups)
            results = await asyncio.gather(*(m.train(g, config=c) for m, g, c in zip(models, groups, configs)))
            assert [r.step for r in results] == [step + 1] * RUNS
            joined.append([r.metrics.get("joint_runs", 1.0) for r in results])
        adapters = [load_file(str(Path(m.run_dir) / "checkpoints" / f"{STEPS:04d}" / "adapter_model.safetensors"))
                    for m in models]
        return sampled, adapters, joined
    finally:
        await backend.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("engine_process", ["in_process", "separate"])
async def test_runs_updating_at_once_train_in_one_pass_with_their_own_updates(tiny_model_dir, tmp_path, engine_process):
    """Three runs (their own rates, seeds and batch sizes) send each step's updates at once. With joint updates,
    every step after the first trains the three in one pass (the first has no timing to wait by, and may train
    some alone); the final adapters equal, to float32 rounding, those of the same steps on the same rollouts
    with joint updates off, where each update trains alone. The same with the worker in a process of its own
    (the separate engine core), where the runs' commands cross a pipe."""
    sampled, joint_adapters, joined = await _train(tiny_model_dir, tmp_path / "joint", joint=True,
                                                   engine_process=engine_process)
    _, alone_adapters, alone_joined = await _train(tiny_model_dir, tmp_path / "alone", joint=False,
                                                   groups_by_step=sampled)
    print("joint_runs by step:", joined)
    assert all(j == [3.0] * RUNS for j in joined[1:]), joined
    assert all(j == [1.0] * RUNS for j in alone_joined), alone_joined
    for k in range(RUNS):
        assert joint_adapters[k].keys() == alone_adapters[k].keys()
        for name, value in joint_adapters[k].items():
            torch.testing.assert_close(value, alone_adapters[k][name], rtol=1e-4, atol=1e-6)
        moved = max(float((v - alone_adapters[k][n]).abs().max()) for n, v in joint_adapters[k].items())
        print(f"run{k}: largest difference joint - alone {moved:.2e}")
    # the runs moved apart (their own rates and rollouts): no run's adapter is another's
    assert not torch.equal(next(iter(joint_adapters[0].values())), next(iter(joint_adapters[1].values())))


class _StubWorker:
    """The seam `JointUpdates` drives (DeviceWorker's methods), with a pass that records who trained together."""

    def __init__(self, runs, fail_with=None):
        from types import SimpleNamespace

        self.runs = list(runs)
        self.replicas = {r: SimpleNamespace(trainer=None, device=SimpleNamespace(type="meta")) for r in runs}
        self.rank = 0
        self.passes: list[list[str]] = []
        self.kept: list[tuple[str, int]] = []  # (run, step) of each publication's copy taken after a pass
        self.fail_with = fail_with

    def runs_of(self, base):
        return list(self.runs)

    def update_pause(self, replica, updates):
        import contextlib

        return contextlib.AsyncExitStack()

    def update_bar(self, step):
        import contextlib

        return contextlib.nullcontext(None)

    def update_runner(self, replica, pause, fn):
        worker = self

        class Runner:
            async def run(self, _fn, parts, *, step, plan, progress):
                await asyncio.sleep(0.01)
                if worker.fail_with is not None:
                    raise worker.fail_with
                worker.passes.append([p.batch for p in parts])
                return [{"loss": float(i)} for i in range(len(parts))]

        return Runner(), None

    async def keep_snapshot(self, run, pause, step):
        self.kept.append((run, step))

    async def update_alone(self, command):
        await asyncio.sleep(0.01)
        self.passes.append([command.run])
        return [{"loss": -1.0}]


def _command(run, step=0, config=None):
    from groupwise.backend.protocol import Update, UpdateCommand

    return UpdateCommand(run, step, (Update(run, config or gw.TrainConfig(), "grpo"),))  # the batch: the run's name


@pytest.mark.asyncio
async def test_updates_waiting_at_once_form_one_pass_and_a_run_that_stops_coming_is_waited_for_once():
    from groupwise.backend.joint_updates import JointUpdates

    worker = _StubWorker(["a", "b", "c"])
    joint, lock = JointUpdates(worker, "base"), asyncio.Lock()
    joint.plan = lambda parts: SimpleNamespace(worth=True)  # the stub's parts have no trainers to plan with
    out = await asyncio.gather(*(joint.update(_command(r), lock) for r in "abc"))
    assert worker.passes == [["a", "b", "c"]] and [o[0]["loss"] for o in out] == [0.0, 1.0, 2.0]
    # each run's publication of step 1 gets the copy taken right after the pass
    assert worker.kept == [("a", 1), ("b", 1), ("c", 1)]
    # "c" finished: "a" and "b" train together; "c" was waited for once, then is no longer expected
    await asyncio.gather(*(joint.update(_command(r, 1), lock) for r in "ab"))
    assert worker.passes[-1] == ["a", "b"] and joint.missed == {"c"}
    # a late run comes back: expected again from its next update on
    await joint.update(_command("c", 1), lock)
    assert worker.passes[-1] == ["c"] and joint.missed == {"a", "b"}
    # updates whose micro-batch settings differ do not share a pass: each group its own
    other = gw.TrainConfig(micro_batch_tokens=1024)
    await asyncio.gather(joint.update(_command("a", 2), lock), joint.update(_command("b", 2, other), lock),
                         joint.update(_command("c", 2), lock))
    assert sorted(map(sorted, worker.passes[-2:])) == [["a", "c"], ["b"]]
    assert joint.pending == []


@pytest.mark.asyncio
async def test_a_failed_pass_fails_every_run_in_it_and_the_next_pass_runs():
    from groupwise.backend.joint_updates import JointUpdates

    worker = _StubWorker(["a", "b"], fail_with=RuntimeError("out of memory"))
    joint, lock = JointUpdates(worker, "base"), asyncio.Lock()
    joint.plan = lambda parts: SimpleNamespace(worth=True)
    out = await asyncio.gather(*(joint.update(_command(r), lock) for r in "ab"), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) and "out of memory" in str(o) for o in out), out
    assert worker.kept == []  # a failed pass keeps no copy to publish
    worker.fail_with = None
    out = await asyncio.gather(*(joint.update(_command(r, 1), lock) for r in "ab"))
    assert worker.passes == [["a", "b"]] and joint.pending == []


@pytest.mark.asyncio
async def test_updates_train_alone_by_default(tiny_model_dir, tmp_path):
    """Joint updates are asked for (`joint_updates=True`): by default every update trains alone (the option's
    help says why), and a value other than True or False is refused."""
    assert gw.BackendOptions().joint_updates is False
    with pytest.raises(ConfigError, match="joint_updates=None must be True or False"):
        gw.BackendOptions(joint_updates=None)
    _, _, joined = await _train(tiny_model_dir, tmp_path, joint=None)  # the default
    assert all(j == [1.0] * RUNS for j in joined), joined


@pytest.mark.asyncio
async def test_a_model_that_cannot_join_trains_each_update_alone_from_then_on():
    from groupwise.backend.joint_updates import JointUpdates
    from groupwise.training.lora_forward import JointLayoutError

    worker = _StubWorker(["a", "b"], fail_with=JointLayoutError("flattened"))
    joint, lock = JointUpdates(worker, "base"), asyncio.Lock()
    joint.plan = lambda parts: SimpleNamespace(worth=True)
    out = await asyncio.gather(*(joint.update(_command(r), lock) for r in "ab"))
    assert [o[0]["loss"] for o in out] == [-1.0, -1.0] and sorted(map(tuple, worker.passes)) == [("a",), ("b",)]
    assert joint.refused == "flattened"


@pytest.mark.asyncio
async def test_a_group_whose_micro_batches_barely_pack_trains_alone():
    """`JointPlan.worth` says no (the runs' steps fill their own micro-batches): each update trains alone, in turn."""
    from groupwise.backend.joint_updates import JointUpdates

    worker = _StubWorker(["a", "b"])
    joint, lock = JointUpdates(worker, "base"), asyncio.Lock()
    joint.plan = lambda parts: SimpleNamespace(worth=False)
    out = await asyncio.gather(*(joint.update(_command(r), lock) for r in "ab"))
    assert [o[0]["loss"] for o in out] == [-1.0, -1.0] and sorted(map(tuple, worker.passes)) == [("a",), ("b",)]
    assert joint.passes[1] == 2 and joint.refused is None
