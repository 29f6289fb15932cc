"""Several runs on one LocalBackend share one base model and one engine, and each trains as if alone.

Three runs of one base with different learning rates train at once (their rollouts interleave in the
shared engine's batches, their updates take turns on the shared base weights); each run's rollouts,
history rows and checkpoints (adapter and optimizer after every step) equal those of the same run
trained alone on a backend of its own. The engine is batch-invariant and the requests are seeded, so
what a run samples does not depend on which other runs' requests were batched with it.

Isolation: beside a healthy run, one run diverges (NonFiniteError), one run's rollout crashes, one is
cancelled in the middle of its update; the healthy run ends exactly as it does alone, and each broken
run's checkpoints are those of its own solo run up to where it broke.
"""

from __future__ import annotations

import asyncio

import pytest
from history_rows import stable_rows
from safetensors.torch import load_file

import groupwise as gw
from groupwise.errors import NonFiniteError
from groupwise.runs.run_id import RunId

pytest.importorskip("torch")
pytest.importorskip("peft")

PROJECT = "sweep"
STEPS = 3


def _backend(path) -> gw.LocalBackend:
    # every checkpoint kept (retention off), so each step's adapter can be compared
    return gw.LocalBackend(path=str(path), device="cpu", best_checkpoint_metric=None, serve_http=False,
                           engine_kwargs={"batch_invariant": True})


def _reward(text: str) -> float:
    """A property of the sampled text (so a run that sampled differently would score differently)."""
    return len(set(text)) / 10 + text.count(" ") / 5


async def _groups(model, step: int, *, crash_at: int | None = None) -> list[gw.TrajectoryGroup]:
    client = model.openai_client()

    async def one(g: int, i: int) -> gw.Trajectory:
        if step == crash_at and i == 2:
            raise RuntimeError("the rollout's environment crashed")
        messages = [{"role": "user", "content": f"Tell me about topic {g}."}]
        r = await client.chat.completions.create(model=model.inference_name(), messages=messages, max_tokens=6,
                                                 temperature=1.0, seed=1000 * step + 10 * g + i)
        return gw.Trajectory(messages_and_choices=[*messages, r.choices[0]],
                             reward=_reward(r.choices[0].message.content or ""))

    # every request of the step at once: the runs' requests meet in the engine's batches
    flat = await asyncio.gather(*(one(g, i) for g in range(2) for i in range(4)))
    return [gw.TrajectoryGroup(flat[4 * g:4 * g + 4]) for g in range(2)]


async def _train(model, rates: list[float], *, crash_at: int | None = None) -> None:
    for step, lr in enumerate(rates):
        await model.train(await _groups(model, step, crash_at=crash_at), config=gw.TrainConfig(learning_rate=lr))


async def _alone(tmp_path, tiny_model_dir, name: str, rates: list[float], **kwargs) -> BaseException | None:
    backend = _backend(tmp_path / f"alone-{name}")
    model = gw.TrainableModel(name=name, project=PROJECT, base_model=tiny_model_dir)
    await model.register(backend)
    try:
        await _train(model, rates, **kwargs)
    except Exception as exc:  # the same failure as in the shared backend: the solo run ends there too
        return exc
    finally:
        await backend.close()
    return None


def _steps(run_dir) -> list[int]:
    return sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())


def assert_same_run(shared, alone) -> None:
    """Rollouts (tokens and rewards exactly), history rows and every checkpoint's adapter and optimizer
    state (floats to a relative 1e-4). Most steps come out bitwise equal; the first token's logprob of a
    few rollouts has been seen to differ by 1e-6 (the prefill of a request whose neighbours in the queue
    differ), which moves the next adapter by ~1e-8."""
    import torch

    assert _steps(shared) == _steps(alone)
    for step in _steps(shared):
        for part in ("adapter_model", "optimizer"):
            a = load_file(str(shared / "checkpoints" / f"{step:04d}" / f"{part}.safetensors"))
            b = load_file(str(alone / "checkpoints" / f"{step:04d}" / f"{part}.safetensors"))
            assert a.keys() == b.keys(), (step, part)
            for key in a:
                torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6, msg=f"step {step} {part} {key}")
    trained = sorted({r["step"] for r in gw.load_history(alone) if r["split"] == "train"})
    for step in trained:
        mine, theirs = gw.load_trajectories(shared, "train", step), gw.load_trajectories(alone, "train", step)
        assert [[gw.choices.choice_token_ids(t.messages_and_choices[-1]) for t in g] for g in mine] == \
            [[gw.choices.choice_token_ids(t.messages_and_choices[-1]) for t in g] for g in theirs]
        assert [g.rewards() for g in mine] == [g.rewards() for g in theirs]
    rows = stable_rows(r for r in gw.load_history(shared) if r["split"] == "train")
    solo = stable_rows(r for r in gw.load_history(alone) if r["split"] == "train")
    assert len(rows) == len(solo) == len(trained)
    for mine, theirs in zip(rows, solo):
        assert mine.keys() == theirs.keys()
        for key, value in mine.items():
            assert value == (pytest.approx(theirs[key], rel=1e-4, abs=1e-6)
                             if isinstance(value, float) else theirs[key]), key


RATES = {"slow": [1e-3] * STEPS, "mid": [3e-3] * STEPS, "fast": [1e-2] * STEPS}


async def test_three_runs_on_one_base_train_at_once_each_exactly_as_alone(tiny_model_dir, tmp_path):
    backend = _backend(tmp_path / "shared")
    models = [gw.TrainableModel(name=name, project=PROJECT, base_model=tiny_model_dir) for name in RATES]
    for model in models:
        await model.register(backend)
    try:
        worker = backend._worker
        # one copy of the base weights and one engine serve and train the three runs
        assert list(worker.bases) == [tiny_model_dir]
        assert len({id(r.engine) for r in worker.replicas.values()}) == 1
        assert len({r.trainer.adapter_name for r in worker.replicas.values()}) == 3
        await asyncio.gather(*(_train(m, RATES[m.name]) for m in models))
        # the engine did batch the runs' requests together (else this test would prove nothing about sharing)
        assert worker.bases[tiny_model_dir].engine.stats.max_decode_batch > 8
    finally:
        await backend.close()
    for name, rates in RATES.items():
        assert await _alone(tmp_path, tiny_model_dir, name, rates) is None
        assert_same_run(tmp_path / "shared" / PROJECT / "models" / name, tmp_path / f"alone-{name}" / PROJECT / "models" / name)
    # the three learning rates gave three different adapters: each run trained its own
    last = [load_file(str(tmp_path / "shared" / PROJECT / "models" / n / "checkpoints" / f"{STEPS:04d}" / "adapter_model.safetensors"))
            for n in RATES]
    key = next(k for k in last[0] if "lora_A" in k)
    assert not any(last[i][key].equal(last[j][key]) for i in range(3) for j in range(i + 1, 3))


async def test_a_diverging_a_crashing_and_a_cancelled_run_leave_the_others_as_alone(tiny_model_dir, tmp_path):
    plans = {
        "healthy": dict(rates=[3e-3] * STEPS),
        "diverges": dict(rates=[3e-3, 1e39, 3e-3]),  # step 1 overflows the adapter: NonFiniteError
        "crashes": dict(rates=[3e-3] * STEPS, crash_at=1),  # a rollout of step 1 raises
        "cancelled": dict(rates=[3e-3] * STEPS),  # cancelled during the update of step 1
    }
    backend = _backend(tmp_path / "shared")
    models = {name: gw.TrainableModel(name=name, project=PROJECT, base_model=tiny_model_dir) for name in plans}
    for model in models.values():
        await model.register(backend)
    try:
        updating = asyncio.Event()
        update = backend._worker.update

        async def noticed_update(command):
            if (command.run, command.step) == (f"{PROJECT}/cancelled", 1):
                updating.set()
            return await update(command)

        backend._worker.update = noticed_update
        tasks = {name: asyncio.create_task(_train(models[name], **plan)) for name, plan in plans.items()}
        await updating.wait()  # the update of its step 1 is under way
        tasks["cancelled"].cancel()
        run = backend._runs[RunId.of(models["cancelled"])]
        results = dict(zip(tasks, await asyncio.gather(*tasks.values(), return_exceptions=True)))
        assert results["healthy"] is None
        assert isinstance(results["diverges"], NonFiniteError)
        assert isinstance(results["crashes"], RuntimeError)
        assert isinstance(results["cancelled"], asyncio.CancelledError)
        # the cancelled caller did not cut the step short: it ran to its checkpoint (no half-updated adapter)
        async with run.lock:
            assert run.step == 2
        # the backend goes on serving and training the survivors
        assert (await models["diverges"].train(await _groups(models["diverges"], 1),
                                               config=gw.TrainConfig(learning_rate=3e-3))).step == 2
    finally:
        await backend.close()
    shared = tmp_path / "shared" / PROJECT / "models"
    assert await _alone(tmp_path, tiny_model_dir, "healthy", plans["healthy"]["rates"]) is None
    assert_same_run(shared / "healthy", tmp_path / "alone-healthy" / PROJECT / "models" / "healthy")
    # each broken run holds exactly its solo run's checkpoints up to where it broke
    assert isinstance(await _alone(tmp_path, tiny_model_dir, "crashes", **plans["crashes"]), RuntimeError)
    assert_same_run(shared / "crashes", tmp_path / "alone-crashes" / PROJECT / "models" / "crashes")
    assert await _alone(tmp_path, tiny_model_dir, "cancelled", plans["cancelled"]["rates"][:2]) is None
    assert_same_run(shared / "cancelled", tmp_path / "alone-cancelled" / PROJECT / "models" / "cancelled")
    assert _steps(shared / "diverges") == [1, 2]  # step 1 failed and wrote nothing; the retry is step 2


async def test_a_run_leaves_the_backend_and_a_new_one_takes_its_place(tiny_model_dir, tmp_path):
    backend = _backend(tmp_path)
    first = gw.TrainableModel(name="first", project=PROJECT, base_model=tiny_model_dir)
    second = gw.TrainableModel(name="second", project=PROJECT, base_model=tiny_model_dir)
    await first.register(backend)
    await second.register(backend)
    try:
        await _train(first, [1e-2])
        await backend.unregister(first)
        worker = backend._worker
        assert list(worker.replicas) == [f"{PROJECT}/second"] and list(worker.bases) == [tiny_model_dir]
        peft_model = worker.bases[tiny_model_dir].peft_model
        assert not [n for n, _ in peft_model.named_parameters() if ".default." in n]  # its adapter is gone
        with pytest.raises(gw.errors.ModelNotFoundError):
            worker.bases[tiny_model_dir].registry.resolve("first")
        # the run folder is free again: registering it again resumes step 1 beside the other run
        await first.register(backend)
        assert await first.get_step() == 1
        await _train(second, [1e-2])
        assert await second.get_step() == 1
    finally:
        await backend.close()


async def test_runs_registered_at_once_share_one_base_and_one_engine(tiny_model_dir, tmp_path):
    """Two registrations awaited together (asyncio.gather; or two drivers of a shared worker,
    backend/sharing.py) each found no base loaded while the other loaded it, and loaded it again: each
    run then had an engine of its own, and the frontends of a separate engine core knew only the last."""
    backend = _backend(tmp_path / "at-once")
    models = [gw.TrainableModel(name=name, project=PROJECT, base_model=tiny_model_dir) for name in ("one", "two")]
    try:
        await asyncio.gather(*(m.register(backend) for m in models))
        worker = backend._worker
        assert list(worker.bases) == [tiny_model_dir]
        assert len({id(r.engine) for r in worker.replicas.values()}) == 1
        assert len({id(r.base) for r in worker.replicas.values()}) == 1
    finally:
        await backend.close()
