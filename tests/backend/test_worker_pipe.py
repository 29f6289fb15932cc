"""The pipe between the driver and a worker process (backend/processes.py): a worker runs each command as a
task of its own, so a command that waits (a publication waiting for its checkpoint's files) does not hold
the pipe, and each answer reaches the call that sent its command.

The worker's side runs `_serve` over a real `multiprocessing` pipe against a stand-in worker whose two
commands can only both end if the second starts while the first waits; the driver's side runs several
runs' steps at once on a real separate engine core (a worker process on the CPU): every run's
checkpoints are written and every step's adapter is served under its own name."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading

from backend_helpers import ask, checkpoint_steps, sample_groups

import groupwise as gw
from groupwise.backend.processes import _recv, _send, _serve

CONFIG = gw.TrainConfig(learning_rate=5e-2)


class WaitingWorker:
    """`first` ends only once `second` has run; `close` records that it ran after both."""

    def __init__(self) -> None:
        self.released = asyncio.Event()
        self.log: list[str] = []

    async def first(self, value: int) -> int:
        await self.released.wait()
        self.log.append("first")
        return value * 10

    async def second(self) -> str:
        self.released.set()
        self.log.append("second")
        return "go"

    async def broken(self) -> None:
        raise ValueError("this command fails")

    async def close(self) -> None:
        self.log.append("close")


def test_a_worker_answers_a_later_command_while_an_earlier_one_waits():
    driver, child = multiprocessing.Pipe()
    worker = WaitingWorker()
    serving = threading.Thread(target=asyncio.run, args=(_serve(worker, child),), daemon=True)
    serving.start()
    _send(driver, (7, "first", {"value": 3}))
    _send(driver, (8, "second", {}))
    _send(driver, (9, "broken", {}))
    answers = {}
    for _ in range(3):
        assert driver.poll(20), f"no answer: the worker is stuck on one command (got {answers})"
        cid, reply = _recv(driver)
        answers[cid] = reply
    assert answers[8] == ("ok", "go")
    assert answers[7] == ("ok", 30)
    assert answers[9][0] == "error" and isinstance(answers[9][1], ValueError)
    assert worker.log == ["second", "first"]  # the first command waited for the second, which went ahead
    _send(driver, (10, "close", {}))
    assert driver.poll(20)
    assert _recv(driver) == (10, ("ok", None))
    serving.join(20)
    assert not serving.is_alive() and worker.log[-1] == "close"


async def test_several_runs_step_at_once_on_a_separate_engine_core(tiny_model_dir, tmp_path):
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", engine_process="separate", best_checkpoint_metric=None)
    models = [gw.TrainableModel(f"run{i}", project="pipe", base_model=tiny_model_dir) for i in range(3)]
    try:
        for model in models:
            await model.register(backend)

        async def steps(model: gw.TrainableModel) -> None:
            for step in range(2):
                groups = await sample_groups(model, step=step)
                await model.train(groups, config=CONFIG)

        await asyncio.gather(*(steps(m) for m in models))
        for model in models:
            assert await model.get_step() == 2
            assert checkpoint_steps(model) == [1, 2]
            client = model.openai_client()
            # each run's latest step is served under its own name (the mirrored registry of each publication)
            assert await ask(client, f"{model.name}@2") == f"{model.name}@2"
    finally:
        await backend.close()


def test_one_worker_serves_calls_of_two_event_loops_and_overlapping_calls_get_their_own_answers(tmp_path):
    """A backend outlives an `asyncio.run` (a user's set-up in one, training in the next): the reader thread
    hands each answer to the loop of the call that waits for it. Calls that overlap on one worker each get
    their own answer (matched by id, not by order)."""
    from groupwise.backend.processes import WorkerProcesses
    from groupwise.backend.worker import WorkerOptions

    options = WorkerOptions(dtype=None, max_batch_size=4, engine_kwargs=None, verify_adapter=False, joint_updates=True, load_model=None,
                            memory_budget_gb=None)
    workers = WorkerProcesses(["cpu"], options, timeout_s=60, cpu_threads=1)

    async def first() -> None:
        await workers.start()
        state, = await workers.call("served_state", [{}])
        assert state == {"cores": {}, "runs": {}}

    async def second() -> list:
        answers = await asyncio.gather(*(workers.call(m, [{}]) for m in ("peak_memory", "served_state") * 4))
        await workers.call("close", [{}])
        await workers.stop()
        return answers

    try:
        asyncio.run(first())
        answers = asyncio.run(second())
    finally:
        workers.kill()
    for i, (answer,) in enumerate(answers):
        if i % 2:
            assert answer == {"cores": {}, "runs": {}}
        else:
            assert isinstance(answer, dict) and "cores" not in answer, answer
