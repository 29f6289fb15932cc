"""The step protocol (backend/protocol.py): the step crosses to the ranks as typed commands.

A step is two calls per rank: its update, then its publication (checkpoint, serve, check and retention
in one `PublishCommand`). Every placement runs the same `DeviceWorker` (in process, a process per device, a Ray actor), so its
methods are the protocol's: each takes one command of its type, and the commands survive the pickling a
worker process's pipe and a Ray call put them through. The behaviour of each command on real ranks is
covered by the backend contract tests (tests/backend/test_contract.py, test_data_parallel.py,
test_placement.py), which train through it.
"""

from __future__ import annotations

import inspect
import pickle
import typing

import pytest

from backend_helpers import checkpoint_steps, make_backend, sample_groups

import groupwise as gw
from groupwise.backend import processes, ray
from groupwise.backend.options import BackendOptions
from groupwise.backend.protocol import (PruneCommand, Published, PublishCommand, RetainCommand, Update, UpdateCommand,
                                       Worker)
from groupwise.backend.retention import retain_command
from groupwise.backend.worker import DeviceWorker, WorkerOptions


def _options() -> WorkerOptions:
    return WorkerOptions(dtype=None, max_batch_size=2, engine_kwargs=None, verify_adapter=True, joint_updates=True, load_model=None,
                         memory_budget_gb=None)


def test_every_placement_runs_a_worker_of_the_protocol():
    assert isinstance(DeviceWorker(0, 1, "cpu", _options()), Worker)
    assert issubclass(ray._RayWorker, DeviceWorker)
    assert inspect.signature(processes._serve).parameters["worker"].annotation in (DeviceWorker, "DeviceWorker")
    for name, command in (("update", UpdateCommand), ("publish", PublishCommand), ("retain", RetainCommand),
                          ("prune", PruneCommand)):
        assert command.method == name
        # one parameter, `command`, of that command's type: what `WorkerBackend._send` passes
        params = list(inspect.signature(getattr(DeviceWorker, name)).parameters.values())[1:]
        hints = typing.get_type_hints(getattr(DeviceWorker, name))
        # Ray's actor methods take its tracing context as well (`_ray_trace_ctx`)
        assert [p.name for p in params if not p.name.startswith("_ray")] == ["command"] and hints["command"] is command, name


def test_commands_survive_the_pipe_and_name_the_run_by_its_key():
    config = gw.TrainConfig(learning_rate=3e-4)
    commands = [UpdateCommand("p1/agent", 2, (Update([1, 2, 3], config, "grpo"),)),
                PublishCommand("p1/agent", 3, {"loss": 0.5}, {"epoch": 1}, history=({"step": 2},),
                               retain=RetainCommand("p1/agent", 3, served_steps=1, best_metric="val/reward")),
                RetainCommand("p1/agent", 3, served_steps=2, best_metric=None, keep=(1,), in_use=(2,)),
                PruneCommand("p1/agent", 3, best_metric="val/reward", metrics_by_step={1: 0.5}, in_use=(2,))]
    for command in commands:
        back = pickle.loads(pickle.dumps(command))
        assert back == command and back.method == command.method and back.run == "p1/agent"
    assert pickle.loads(pickle.dumps(commands[0])).updates[0].config.model_fields_set == {"learning_rate"}
    assert pickle.loads(pickle.dumps(Published(1, fingerprint=[3, 4], deleted=(2,)))) == Published(
        1, fingerprint=[3, 4], deleted=(2,))


def test_retention_is_one_command_every_rank_applies():
    class Run:
        store = None
        step, best_step, kl_reference_step, held_steps = 5, 3, 2, [4]

    command = retain_command(Run(), "p/agent", BackendOptions(served_steps=2, best_checkpoint_metric="val/reward"))
    assert command == RetainCommand("p/agent", 5, served_steps=2, best_metric="val/reward", keep=(3,),
                                    metrics_by_step={}, maximize=True, in_use=(2, 4))


def test_a_steps_retention_counts_its_own_row_before_it_is_appended():
    class History:
        def rows(self, split):
            return [{"step": 0, "split": split, "reward": 0.5}] if split == "val" else []

    class Run:
        class store:
            run_history = History()
        step, best_step, kl_reference_step, held_steps = 1, None, None, []

    options = BackendOptions(served_steps=1, best_checkpoint_metric="val/reward")
    new_rows = ({"step": 1, "split": "val", "reward": 0.75}, {"step": 1, "split": "train", "reward": 9.0})
    command = retain_command(Run(), "p/agent", options, step=2, new_rows=new_rows)
    # the new step, and the pending val row (the train row is another split)
    assert command.step == 2 and command.metrics_by_step == {0: 0.5, 1: 0.75}
    assert retain_command(Run(), "p/agent", options).step == 1


async def test_a_step_is_one_update_and_one_publication_that_applies_retention(tiny_model_dir, tmp_path, request):
    """In process: per step the driver calls the worker twice (update, publish) and never `retain`; the
    publication unserves past `served_steps` and deletes the checkpoints that are neither the latest nor
    the best by the history metric, the step's own row counted."""
    backend = make_backend("local", tmp_path, request, served_steps=1, best_checkpoint_metric="train/reward")
    model = gw.TrainableModel("agent", project="p", base_model=tiny_model_dir)
    calls: list[str] = []
    send = backend._call

    async def recording(method, kwargs):
        calls.append(method)
        return await send(method, kwargs)

    backend._call = recording
    await model.register(backend)
    try:
        config = gw.TrainConfig(learning_rate=1e-2)
        for step, bonus in enumerate([0.0, 10.0, 0.0]):  # step 1's rollouts (checkpoint 1's) score best
            groups = await sample_groups(model, step=step)
            for g in groups:
                for t in g.trajectories:
                    t.reward += bonus
            calls.clear()
            await model.train(groups, config=config)
            assert calls == ["update", "publish"], calls
            assert await backend.served_steps(model) == [0, step + 1]
            # after step 1 the best (checkpoint 1, by the row step 1 appends) and the latest stay
            assert checkpoint_steps(model) == [[1], [1, 2], [1, 3]][step]
    finally:
        await backend.close()
    # checkpoint 2 was renamed away at step 3 and its files removed off the step's path: gone by the close
    assert sorted(p.name for p in model.store.checkpoints_dir.iterdir()) == ["0001", "0003"]


async def test_the_publication_holds_the_weights_the_update_left(tiny_model_dir, tmp_path):
    """The copy a publication writes and serves is taken right after the update, on its thread
    (`Publications.keep`), not when the publication starts: the checkpoint holds the update's
    weights, and a trainer whose tensors changed after the copy fails the check of what is served."""
    import torch
    from safetensors.torch import load_file

    from groupwise.errors import AdapterMismatchError

    backend = gw.LocalBackend(path=str(tmp_path), device="cpu")
    model = gw.TrainableModel("agent", project="p", base_model=tiny_model_dir)
    await model.register(backend)
    worker = backend._worker
    trainer = worker.replicas["p/agent"].trainer
    send, updated = backend._call, {}

    async def spoil_after_the_update(method, kwargs):
        out = await send(method, kwargs)
        if method == "update":
            with torch.no_grad():
                updated.update({n: p.detach().clone() for n, p in trainer.trainable_named_parameters()})
                for _, p in trainer.trainable_named_parameters():
                    p.add_(1.0)
        return out

    backend._call = spoil_after_the_update
    try:
        with pytest.raises(AdapterMismatchError, match="after step 1 the engine's 'p/agent@1' does not hold"):
            await model.train(await sample_groups(model), config=gw.TrainConfig(learning_rate=1e-2))
        assert updated and worker.publications.take("p/agent", 1) is None  # the kept copy was used, once
        # the checkpoint is the update's (its files name tensors peft's way: compare the values)
        written = load_file(model.store.checkpoints_dir / "0001" / "adapter_model.safetensors")
        assert len(written) == len(updated)
        assert sorted(t.sum().item() for t in written.values()) == sorted(t.sum().item() for t in updated.values())
        assert worker.publications.take("p/agent", 9) is None  # no copy kept for a step: the publication takes one
    finally:
        await backend.close()
