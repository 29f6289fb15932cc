"""Faults of a data-parallel run, with real worker processes: a worker killed with SIGKILL mid-step and a
worker that stops answering (SIGSTOP) both make the driver raise a clear `WorkerError` (never hang), stop
the other workers, and leave the last checkpoint intact; a new backend resumes from it with every rank
restored identically (adapter, optimizer state, RNG, data cursor)."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile

import pytest
import torch
from backend_helpers import make_backend, sample_groups
from safetensors.torch import load_file

import groupwise as gw
from groupwise.backend.driver import WorkerError


def alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our exited child
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


async def resumed_identically(backend, model, step: int, cursor: dict) -> None:
    assert await model.get_step() == step
    assert await backend.checkpoint_cursor(model) == cursor
    checkpoint = model.store.checkpoints_dir / f"{step:04d}"
    saved = load_file(str(checkpoint / "adapter_model.safetensors"))
    saved_opt = load_file(str(checkpoint / "optimizer.safetensors"))
    saved_rng = load_file(str(checkpoint / "rng.safetensors"))["torch_cpu"]
    ranks = await backend.rank_states(model)
    assert len(ranks) == 2
    for rank in ranks:
        adapter = {k.replace(".default", ""): v for k, v in rank["adapter"].items()}
        assert adapter.keys() == saved.keys() and all(torch.equal(adapter[k], saved[k]) for k in saved)
        assert rank["optimizer"].keys() == saved_opt.keys()
        assert all(torch.equal(rank["optimizer"][k], saved_opt[k]) for k in saved_opt)
        assert torch.equal(rank["rng"], saved_rng)


@pytest.mark.slow
async def test_dead_or_stuck_worker_raises_and_every_rank_resumes_identically(tiny_model_dir, tmp_path, request,
                                                                               monkeypatch):
    config = gw.TrainConfig(learning_rate=1e-2)
    scratch = tmp_path / "tmp"  # the temp folder of the driver and of the ranks it starts
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    async def start(timeout_s: float = 60):
        backend = make_backend("data_parallel", tmp_path, request, best_checkpoint_metric=None)
        backend.options.collective_timeout_s = timeout_s
        model = gw.TrainableModel("faulty", project="faults", base_model=tiny_model_dir)
        await model.register(backend)
        return backend, model

    # 1. one step, then rank 1 is killed with SIGKILL while the next step runs
    backend, model = await start()
    await model.train(await sample_groups(model), config=config, cursor={"offset": 1})
    pids = backend.worker_pids
    groups = await sample_groups(model, step=1)
    # rank 1 is held (SIGSTOP) so the step is surely under way when it dies: rank 0 trains its share and
    # waits in the gradient all-reduce, rank 1's command sits unread in its pipe
    os.kill(pids[1], signal.SIGSTOP)
    step = asyncio.create_task(model.train(groups, config=config, cursor={"offset": 2}))
    await asyncio.sleep(2)
    assert not step.done()
    os.kill(pids[1], signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"rank 1 .* was killed by SIGKILL during 'update'"):
        await asyncio.wait_for(step, timeout=120)  # the guard against a hang; the error comes at once
    assert not any(alive(pid) for pid in pids)  # the other rank was stopped too
    assert list(scratch.iterdir()) == []  # and no rank left a temporary folder behind
    with pytest.raises(WorkerError, match="SIGKILL"):  # the backend stays failed, loudly
        await model.train(groups, config=config)
    await backend.close()

    # 2. a new backend resumes step 1 on both ranks; then rank 1 stops answering (SIGSTOP) mid-run:
    # rank 0 gives up in the gradient all-reduce after the collective timeout, and the driver stops both
    backend, model = await start(timeout_s=5)
    await resumed_identically(backend, model, 1, {"offset": 1})
    await model.train(await sample_groups(model, step=1), config=config, cursor={"offset": 2})
    pids = backend.worker_pids
    os.kill(pids[1], signal.SIGSTOP)
    try:
        with pytest.raises(WorkerError, match=r"rank\(s\) \[1\] did not answer 'update'"):
            await asyncio.wait_for(model.train(groups, config=config), timeout=120)
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not any(alive(pid) for pid in pids)
    await backend.close()

    # 3. and the run resumes from step 2, every rank identical
    backend, model = await start()
    try:
        await resumed_identically(backend, model, 2, {"offset": 2})
        result = await model.train(await sample_groups(model, step=2), config=config)
        assert result.step == 3
    finally:
        await backend.close()
