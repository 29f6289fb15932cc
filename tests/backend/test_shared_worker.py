"""One worker shared by drivers in several processes (`LocalBackend.share()`, `LocalBackend(join=...)`),
with real processes on the CPU: a run whose driver joined from another process trains as it would on a
backend of its own (the same greedy rollouts, rewards and loss) beside a run of the sharing process, on
one engine; a joining driver killed with SIGKILL loses its runs on the worker while the sharing driver and
another joining driver go on; a worker that dies fails the joining driver's next command with a
`WorkerError` naming the signal; and wrong arguments are refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import groupwise as gw
from groupwise.backend.driver import WorkerError
from groupwise.errors import ConfigError

CONFIG = gw.TrainConfig(learning_rate=5e-2)
HERE = Path(__file__).resolve().parent

# A joining driver: registers run `name` on the worker at `address`, takes `steps` greedy GRPO steps
# (test_engine_core_backend's rollouts), prints each step's rollouts and loss as a JSON line, then
# waits for a line on stdin before it closes (the tests kill it there, or let it close).
JOINER = textwrap.dedent("""
    import asyncio, json, sys
    sys.path.insert(0, {here!r})
    import groupwise as gw
    from test_engine_core_backend import greedy_groups, first_step

    async def main(address, path, base, name, steps):
        backend = gw.LocalBackend(path=path, join=address, best_checkpoint_metric=None)
        model = gw.TrainableModel(name, project="shared", base_model=base)
        await model.register(backend)
        for _ in range(steps):
            groups = await greedy_groups(model)
            result = await model.train(groups, config=gw.TrainConfig(learning_rate=5e-2))
            print(json.dumps({{"rollouts": first_step(groups), "loss": result.metrics["loss"],
                              "step": result.step, "pid": backend.worker_pids[0]}}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await backend.close()
        print("CLOSED", flush=True)

    asyncio.run(main(*sys.argv[1:5], int(sys.argv[5])))
""").format(here=str(HERE))


def start_joiner(tmp_path, address: str, base: str, name: str, steps: int) -> subprocess.Popen:
    script = tmp_path / "joiner.py"
    script.write_text(JOINER)
    return subprocess.Popen([sys.executable, str(script), address, str(tmp_path / "store"), base, name, str(steps)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


async def read_line(proc: subprocess.Popen, timeout_s: float = 300) -> str:
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    assert line, f"the joining driver exited ({proc.poll()}) before it printed"
    return line


async def one_step_alone(tiny_model_dir, path) -> dict:
    from test_engine_core_backend import first_step, greedy_groups

    backend = gw.LocalBackend(path=str(path), device="cpu", best_checkpoint_metric=None)
    model = gw.TrainableModel("joined", project="shared", base_model=tiny_model_dir)
    try:
        await model.register(backend)
        groups = await greedy_groups(model)
        result = await model.train(groups, config=CONFIG)
        return {"rollouts": json.loads(json.dumps(first_step(groups))), "loss": result.metrics["loss"]}
    finally:
        await backend.close()


@pytest.mark.slow
async def test_a_joined_driver_trains_as_alone_beside_the_sharing_one_and_its_death_frees_only_its_run(
        tiny_model_dir, tmp_path):
    from test_engine_core_backend import greedy_groups

    alone = await one_step_alone(tiny_model_dir, tmp_path / "alone")

    owner = gw.LocalBackend(path=str(tmp_path / "store"), device="cpu", engine_process="separate",
                            best_checkpoint_metric=None)
    joiners: list[subprocess.Popen] = []
    try:
        address = await owner.share()
        assert address.startswith("ipc://") and await owner.share() == address
        mine = gw.TrainableModel("mine", project="shared", base_model=tiny_model_dir)
        await mine.register(owner)
        joiners = [start_joiner(tmp_path, address, tiny_model_dir, "joined", 1),
                   start_joiner(tmp_path, address, tiny_model_dir, "doomed", 1)]
        first, doomed = [json.loads(await read_line(p)) for p in joiners]
        # the joined run's first step is the step it takes on a backend of its own: the same tokens and
        # rewards; log-probs to fp32's rounding, since its rows now share the engine's batch with others
        assert [(t, r) for t, _, r in first["rollouts"]] == [(t, r) for t, _, r in alone["rollouts"]]
        for (_, got, _), (_, want, _) in zip(first["rollouts"], alone["rollouts"]):
            assert got == pytest.approx(want, rel=1e-5)
        assert first["loss"] == pytest.approx(alone["loss"], rel=1e-4, abs=1e-6)
        assert first["pid"] == doomed["pid"] == owner.worker_pids[0]  # one worker, one engine
        [state] = await owner._call_all("served_state")
        assert {"mine", "joined", "doomed"} <= {name.split("/")[-1] for name in state["runs"]}

        joiners[1].send_signal(signal.SIGKILL)  # a joining driver dies: the worker drops its run only
        joiners[1].wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(name.endswith("doomed") for name in state["runs"]):
            assert time.monotonic() < deadline, "the dead driver's run is still loaded on the worker"
            await asyncio.sleep(0.2)
            [state] = await owner._call_all("served_state")
        result = await mine.train(await greedy_groups(mine), config=CONFIG)  # the sharing driver goes on
        assert result.step == 1
        joiners[0].stdin.write("\n")  # the other joining driver closes: its run leaves, the worker stays
        joiners[0].stdin.flush()
        assert (await read_line(joiners[0])).strip() == "CLOSED"
        assert joiners[0].wait(timeout=60) == 0
        [state] = await owner._call_all("served_state")
        assert [name.split("/")[-1] for name in state["runs"]] == ["mine"]
        assert (await mine.train(await greedy_groups(mine), config=CONFIG)).step == 2
    finally:
        for p in joiners:
            if p.poll() is None:
                p.kill()
        await owner.close()


@pytest.mark.slow
async def test_a_joined_driver_fails_with_the_workers_exit_when_it_dies(tiny_model_dir, tmp_path):
    from test_engine_core_backend import greedy_groups

    owner = gw.LocalBackend(path=str(tmp_path / "store"), device="cpu", engine_process="separate",
                            best_checkpoint_metric=None)
    joined = gw.LocalBackend(path=str(tmp_path / "store"), join=await owner.share(), best_checkpoint_metric=None)
    try:
        model = gw.TrainableModel("joined", project="shared", base_model=tiny_model_dir)
        await model.register(joined)
        groups = await greedy_groups(model)
        [pid] = owner.worker_pids
        assert joined.worker_pids == [pid]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="killed by signal 9"):
            await asyncio.wait_for(model.train(groups, config=CONFIG), 60)
    finally:
        await joined.close()
        await owner.close()


async def test_join_refuses_the_workers_settings_and_share_needs_a_separate_engine_on_one_device(tmp_path):
    with pytest.raises(ConfigError, match="drop device, dtype, engine_kwargs"):
        gw.LocalBackend(join="ipc:///tmp/x/commands", device="cpu", dtype="float32", engine_kwargs={"max_seq_len": 64})
    with pytest.raises(ConfigError, match="not an address"):
        gw.LocalBackend(join="localhost:8000")
    with pytest.raises(ConfigError, match="engine_process=\"separate\""):
        await gw.LocalBackend(path=str(tmp_path), device="cpu", engine_process="in_process").share()
    from groupwise.backend.sharing import SharedWorker

    with pytest.raises(WorkerError, match="no worker answered"):  # nothing listens there
        await SharedWorker(f"ipc://{tmp_path}/nothing-here", timeout_s=0.5).start()


# A joining driver that trains with `gw.fit` (lockstep by default): each rollout records when it started
# (time.monotonic is the system's clock: it compares across processes); `delay` slows this run's rollouts.
FIT_JOINER = textwrap.dedent("""
    import asyncio, json, sys, time
    import groupwise as gw

    async def main(address, path, base, name, delay, lockstep):
        backend = gw.LocalBackend(path=path, join=address, best_checkpoint_metric=None)
        model = gw.TrainableModel(name, project="shared", base_model=base)
        await model.register(backend)
        if lockstep == "1":  # a member from now: the other run's first step waits for this one's
            await backend.lockstep_member(model).expect()
        print("READY", flush=True)  # both fit loops start once both runs are on the worker
        await asyncio.to_thread(sys.stdin.readline)
        starts = []

        async def rollout(model, scenario):
            index = len(starts)  # the two rollouts of a group start one after the other: rewards 0 and 1
            starts.append(time.monotonic())
            await asyncio.sleep(delay)
            client = model.openai_client()
            messages = [{"role": "user", "content": f"scenario {scenario}"}]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages, max_tokens=3,
                                                     logprobs=True)
            return gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(index % 2))

        config = gw.LoopConfig(groups_per_step=1, rollouts_per_group=2, max_steps=3, eval_every=100,
                               lockstep=lockstep == "1", train_config=gw.TrainConfig(learning_rate=1e-3))
        await gw.fit(model, rollout, list(range(8)), config=config)
        await backend.close()
        print(json.dumps(starts[::2]), flush=True)  # each step's first rollout

    asyncio.run(main(*sys.argv[1:5], float(sys.argv[5]), sys.argv[6]))
""")


@pytest.mark.slow
@pytest.mark.parametrize("lockstep", [True, False])
async def test_fit_loops_of_joined_drivers_start_each_step_together(tiny_model_dir, tmp_path, lockstep):
    """Two `gw.fit` loops in two processes on one shared worker, one with rollouts 1.5 s slower: in lockstep
    (the default), each run a member before either loop starts, each step's rollouts start together in both
    (the worker's barrier); free-running, the fast
    run's steps go at their own pace (the control that shows the barrier is what holds them together)."""
    owner = gw.LocalBackend(path=str(tmp_path / "store"), device="cpu", engine_process="separate",
                            best_checkpoint_metric=None)
    script = tmp_path / "fit_joiner.py"
    script.write_text(FIT_JOINER)
    procs: list[subprocess.Popen] = []
    try:
        address = await owner.share()
        procs = [subprocess.Popen([sys.executable, str(script), address, str(tmp_path / "store"), tiny_model_dir, name,
                                   str(delay), "1" if lockstep else "0"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
                 for name, delay in (("fast", 0.0), ("slow", 1.5))]
        for p in procs:
            assert (await read_line(p)).strip() == "READY"
        for p in procs:
            p.stdin.write("GO\n")
            p.stdin.flush()
        fast, slow = [json.loads(await read_line(p)) for p in procs]
        assert all(p.wait(timeout=60) == 0 for p in procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        await owner.close()
    assert len(fast) == len(slow) == 3

    def apart(starts: list[float], others: list[float]) -> list[float]:
        """How far each step's start is from the other run's nearest step start."""
        return [min(abs(t - o) for o in others) for t in starts]

    # Each run said it takes part before either loop started (`expect`): every step of both starts together,
    # the first one too. (Without it, a run whose loop reaches its first step before the other has arrived
    # once takes that step alone: members join at their first arrival.)
    if lockstep:
        assert max(apart(fast, slow) + apart(slow, fast)) < 0.75, (fast, slow)
        assert max(abs(f - s) for f, s in zip(fast, slow)) < 0.75, (fast, slow)  # step k with step k
    else:
        # free-running, the fast run's three steps take less time than one of the slow run's
        assert fast[-1] - fast[0] < 0.8 * (slow[1] - slow[0]), (fast, slow)
