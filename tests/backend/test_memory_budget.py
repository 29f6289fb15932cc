"""A backend states its memory budget per base model and refuses, with the figures, a device that cannot hold
it (backend/budget.py): before its engine and trainers allocate, leaving the device to the runs already on it."""

from __future__ import annotations

import pytest

import groupwise as gw
from groupwise.backend.budget import GB, available_bytes
from groupwise.errors import MemoryBudgetError

pytest.importorskip("torch")


async def test_a_budget_the_device_cannot_hold_is_refused_and_the_runs_on_it_go_on(tiny_model_dir, tmp_path):
    from backend_helpers import sample_groups

    room = available_bytes("cpu")
    if room is None:
        pytest.skip("this platform does not report its available memory")
    running = gw.TrainableModel(name="running", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", best_checkpoint_metric=None)
    await running.register(backend)
    try:
        base = backend._worker.bases[tiny_model_dir]
        # the estimate counts the weights it loaded, and a budget this small fits the machine
        weights = sum(p.numel() * p.element_size() for n, p in base.peft_model.named_parameters() if "lora_" not in n)
        assert base.budget.weights == weights and 0 < base.budget.total < room[0]
        # a second backend on this machine asks for more than it has: refused, naming what it needs and has
        greedy = gw.LocalBackend(path=str(tmp_path), device="cpu", memory_budget_gb=2 * room[1] / GB)
        other = gw.TrainableModel(name="greedy", project="p", base_model=tiny_model_dir)
        with pytest.raises(MemoryBudgetError, match=r"needs about .* GB \(memory_budget_gb\) on cpu \(available RAM\), "
                                                    r"which has .* GB free"):
            await other.register(greedy)
        assert greedy._worker.bases == {} and greedy._worker.replicas == {}  # it holds nothing
        await greedy.close()
        # the run already on the machine trains on, and the refused run's folder is free for a backend that fits
        assert (await running.train(await sample_groups(running), config=gw.TrainConfig(learning_rate=1e-3))).step == 1
        modest = gw.LocalBackend(path=str(tmp_path), device="cpu", memory_budget_gb=base.budget.total / GB + 0.01)
        await other.register(modest)
        await modest.close()
    finally:
        await backend.close()


def test_the_budget_option_is_checked():
    with pytest.raises(gw.errors.ConfigError, match="memory_budget_gb"):
        gw.LocalBackend(memory_budget_gb=0)


async def test_every_run_joined_to_a_shared_base_is_counted_and_a_join_the_device_cannot_hold_is_refused(
        tiny_model_dir, tmp_path, monkeypatch):
    """The budget counted one adapter whatever the number of runs on the base: a run joining a base whose
    device had no room for its adapter and AdamW state was let in, and its first step took the memory."""
    from groupwise.backend import budget as budget_module

    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", best_checkpoint_metric=None)
    first = gw.TrainableModel(name="first", project="p", base_model=tiny_model_dir)
    await first.register(backend)
    try:
        base = backend._worker.bases[tiny_model_dir]
        one = base.budget.total
        assert base.budget.models == 1
        # the device has room for the base's budget so far and one byte short of another adapter
        monkeypatch.setattr(budget_module, "available_bytes", lambda device: (base.budget.adapter - 1, 64 * GB))
        second = gw.TrainableModel(name="second", project="p", base_model=tiny_model_dir)
        with pytest.raises(MemoryBudgetError, match=r"2 adapter\(s\)"):
            await second.register(backend)
        assert base.models == ["p/first"] and base.budget.models == 1 and base.budget.total == one
        # with room for it, it joins and the budget counts both runs' adapters
        monkeypatch.setattr(budget_module, "available_bytes", lambda device: (base.budget.adapter, 64 * GB))
        await second.register(backend)
        assert base.models == ["p/first", "p/second"]
        assert base.budget.models == 2 and base.budget.total == one + base.budget.adapter
        third = gw.TrainableModel(name="third", project="p", base_model=tiny_model_dir)
        monkeypatch.setattr(budget_module, "available_bytes", lambda device: (10 * GB, 64 * GB))
        await third.register(backend)
        assert base.budget.models == 3
        await backend.unregister(third)  # a run that leaves gives its share back
        assert base.budget.models == 2 and base.models == ["p/first", "p/second"]
    finally:
        await backend.close()
