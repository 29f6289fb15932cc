"""`LocalBackend(engine_process="separate")`: the workers serve their engines as engine cores beside their
trainers, and the test's process (the user's) is their frontend, with real worker processes on the CPU.
Two GRPO steps give the in-process backend's first step (greedy rollouts: the same tokens, logprobs and
rewards; the same loss) and serve each trained adapter, in process and over loopback HTTP; two CPU workers
as cores (a gloo all-reduce) share the rollouts and train a step; a worker killed with SIGKILL mid-rollouts
fails them at once with the backend's error naming the signal; and the worker does not outlive the
user's process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from backend_helpers import ask, checkpoint_steps

import groupwise as gw
from groupwise.backend.driver import WorkerError
from groupwise.backend.routing import ReplicaRouter
from groupwise.inference.engine_core import pid_exit

CONFIG = gw.TrainConfig(learning_rate=5e-2)


async def greedy_groups(model, n_groups: int = 2, n: int = 4, max_tokens: int = 6) -> list[gw.TrajectoryGroup]:
    """Greedy rollouts through the model's own client; the reward depends on the completion's text."""
    client = model.openai_client()

    async def one(g: int, i: int) -> gw.Trajectory:
        messages = [{"role": "user", "content": f"scenario {g}"}]
        r = await client.chat.completions.create(model=model.inference_name(), messages=messages, max_tokens=max_tokens,
                                                 temperature=0.0, logprobs=True)
        choice = r.choices[0]
        reward = float(i) + 0.01 * len(choice.message.content or "")
        return gw.Trajectory(messages_and_choices=[*messages, choice], reward=reward)

    return [gw.TrajectoryGroup(await asyncio.gather(*(one(g, i) for i in range(n)))) for g in range(n_groups)]


def first_step(groups: list[gw.TrajectoryGroup]) -> list[tuple]:
    """(text, token logprobs, reward) of every rollout, in order."""
    out = []
    for group in groups:
        for t in group.trajectories:
            choice = t.messages_and_choices[-1]
            out.append((choice.message.content, [c.logprob for c in choice.logprobs.content], t.reward))
    return out


async def two_steps(backend: gw.LocalBackend, base_model: str) -> tuple[list[tuple], dict, gw.TrainableModel]:
    model = gw.TrainableModel("core", project="sep", base_model=base_model)
    await model.register(backend)
    groups = await greedy_groups(model)
    rollouts = first_step(groups)
    metrics = (await model.train(groups, config=CONFIG)).metrics
    result = await model.train(await greedy_groups(model), config=CONFIG)
    assert result.step == 2
    return rollouts, metrics, model


@pytest.mark.slow
async def test_a_separate_engine_trains_as_the_in_process_backend_and_serves_each_step(tiny_model_dir, tmp_path):
    inproc = gw.LocalBackend(path=str(tmp_path / "in"), device="cpu", best_checkpoint_metric=None)
    try:
        expected, expected_metrics, _ = await two_steps(inproc, tiny_model_dir)
    finally:
        await inproc.close()

    backend = gw.LocalBackend(path=str(tmp_path / "sep"), device="cpu", engine_process="separate",
                              best_checkpoint_metric=None)
    try:
        rollouts, metrics, model = await two_steps(backend, tiny_model_dir)
        [pid] = backend.worker_pids
        assert pid != os.getpid()  # the engine and trainer are in a worker process
        # greedy rollouts of the first step: the in-process backend's tokens, logprobs and rewards
        assert [(text, reward) for text, _, reward in rollouts] == [(text, reward) for text, _, reward in expected]
        assert len({tuple(lp) for _, lp, _ in rollouts}) > 1  # the prompts' logprobs differ: the comparison bites
        for (_, got, _), (_, want, _) in zip(rollouts, expected):
            assert got == pytest.approx(want, abs=1e-4)
        assert metrics["loss"] == pytest.approx(expected_metrics["loss"], rel=1e-3, abs=1e-6)
        assert metrics["trainable_tokens"] == expected_metrics["trainable_tokens"] > 0
        # both steps checkpointed, and the core serves the latest as `name`, in process and over HTTP
        assert checkpoint_steps(model) == [1, 2]
        assert await backend.served_steps(model) == [0, 1, 2]
        client = model.openai_client()
        assert await ask(client, model.inference_name()) == "core@2"
        assert await ask(client, model.inference_name(1)) == "core@1"
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{model.inference_base_url}/chat/completions",
                                headers={"Authorization": f"Bearer {model.inference_api_key}"},
                                json={"model": "core", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.json()["model"] == "core@2"
    finally:
        await backend.close()
    assert not _alive(pid)


@pytest.mark.slow
async def test_two_cpu_workers_as_engine_cores_share_the_rollouts_and_train(tiny_model_dir, tmp_path):
    backend = gw.LocalBackend(path=str(tmp_path), devices=["cpu", "cpu"], engine_process="separate",
                              collective_timeout_s=60, best_checkpoint_metric=None)
    model = gw.TrainableModel("pair", project="sep", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        assert backend.world_size == 2 and len(set(backend.worker_pids)) == 2
        groups = await greedy_groups(model, n_groups=4, n=2, max_tokens=4)
        router = model.openai_client()._client._transport
        assert isinstance(router, ReplicaRouter)
        assert router.sent[0] > 0 and router.sent[1] > 0  # new prompts spread over both cores
        result = await model.train(groups, config=CONFIG)
        assert result.step == 1 and result.metrics["sequences"] == 8
        a, b = await backend.served_adapters(model, 1)  # each core serves the all-reduced adapter
        assert a.keys() == b.keys() and len(a) > 0 and all((a[k] == b[k]).all() for k in a)
        assert await ask(model.openai_client(), model.inference_name()) == "pair@1"
    finally:
        await backend.close()


def _alive(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our exited child
    except ChildProcessError:
        pass
    return pid_exit(pid)[0]  # a zombie is dead


@pytest.mark.slow
async def test_a_killed_core_fails_the_rollouts_at_once_and_the_backend_says_so(tiny_model_dir, tmp_path):
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", engine_process="separate")
    model = gw.TrainableModel("victim", project="sep", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        client = model.openai_client()
        [pid] = backend.worker_pids

        async def long_rollout(i: int):
            return await client.chat.completions.create(
                model=model.inference_name(), messages=[{"role": "user", "content": f"go {i}"}],
                max_tokens=4000, extra_body={"ignore_eos": True})

        rollouts = [asyncio.create_task(long_rollout(i)) for i in range(4)]
        await asyncio.sleep(1.0)
        assert not any(t.done() for t in rollouts)  # under way when the worker dies
        os.kill(pid, signal.SIGKILL)
        done, pending = await asyncio.wait(rollouts, timeout=60)  # the guard against a hang
        assert not pending
        for task in done:
            with pytest.raises(WorkerError, match=r"worker rank 0 \(device cpu, pid \d+\) was killed by SIGKILL"):
                task.result()
        with pytest.raises(WorkerError, match="SIGKILL"):  # the backend stays failed, loudly
            await backend.served_steps(model)
    finally:
        await backend.close()


HOLDER = """
import asyncio, sys
import groupwise as gw

async def main():
    backend = gw.LocalBackend(path=sys.argv[2], device="cpu", engine_process="separate", serve_http=False)
    await gw.TrainableModel("held", project="sep", base_model=sys.argv[1]).register(backend)
    print(backend.worker_pids[0], flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.slow
def test_the_worker_does_not_outlive_the_users_process(tiny_model_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(gw.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]))
    user = subprocess.Popen([sys.executable, "-c", HOLDER, tiny_model_dir, str(tmp_path)], stdout=subprocess.PIPE,
                            env=env, text=True)
    try:
        worker = int(user.stdout.readline())
        assert _alive(worker)
    finally:
        user.kill()
        user.wait()
    deadline = time.monotonic() + 30
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def test_a_core_holds_its_requests_through_the_trainers_pause_and_announces_adapters_loaded_beside_it(tiny_model_dir):
    """What a worker serving its engine as a core relies on, with a real engine, core and client in one
    process: a request that reaches the core while the engine is paused (the trainer has the model) is
    held, not stepped, and finishes once the pause ends; an adapter the worker loads on the engine
    directly (not through a frontend) is announced, so the client accepts requests for it."""
    import threading

    from groupwise.inference.engine import Engine
    from groupwise.inference.engine_client import connect_engine_core, new_core_address
    from groupwise.inference.engine_core import EngineCoreServer
    from groupwise.inference.requests import GenerationRequest
    from groupwise.inference.sampling import SamplingParams
    from groupwise.runtime.loading import load_base_model
    from groupwise.training.adapters import adapter_snapshot, wrap_with_lora

    model, tok = load_base_model(tiny_model_dir, device="cpu")
    peft_model = wrap_with_lora(model, gw.LoraConfig(rank=4))
    engine = Engine(peft_model, tok, max_batch_size=4, max_new_tokens_default=8)
    server = EngineCoreServer(engine, new_core_address(), owner_pid=os.getpid())
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    client = connect_engine_core(server.address, tok)
    try:
        request = GenerationRequest([1, 2, 3], max_new_tokens=4, sampling=SamplingParams(temperature=0))
        passes = engine.stats.prefill_passes
        with engine.paused():
            future = client.submit(request)
            deadline = time.monotonic() + 30
            while client.status().waiting < 1:  # the request is in the engine's queue
                assert time.monotonic() < deadline, "the request never reached the engine"
                time.sleep(0.02)
            time.sleep(0.3)  # room for a step that the pause must prevent
            assert not future.done() and engine.stats.prefill_passes == passes
        assert len(future.result(timeout=60).completions[0].token_ids) == 4

        tensors, config = adapter_snapshot(peft_model, "default", None)
        engine.add_adapter("run@1", None, weights=tensors, config=config)  # as the worker's registry does
        client.status()  # answered after the core's announcement
        assert "run@1" in client.adapters()
        loaded = GenerationRequest([1, 2, 3], max_new_tokens=2, sampling=SamplingParams(temperature=0), adapter="run@1")
        assert client.submit(loaded).result(timeout=60).adapter == "run@1"
    finally:
        client.close()
        server.stop()
        thread.join(timeout=10)
        engine.close()
