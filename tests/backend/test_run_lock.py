"""One writer per run folder, across real processes: a second trainer of the same run fails at once
(before it loads a model) naming the holder; the lock of a SIGKILLed trainer is taken over."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import groupwise as gw
from groupwise.errors import RunLockedError
from groupwise.runs.store import RunStore

HERE = Path(__file__).parent
HOLD_STORE_LOCK = ("import sys; from groupwise.runs.store import RunStore; "
                   "lock = RunStore(sys.argv[1], 'p', 'm').lock().acquire(); print('locked', flush=True); "
                   "sys.stdin.readline()")


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)  # no cleanup runs: only the kernel can release the lock
    proc.communicate(timeout=60)


def test_the_run_lock_between_real_processes(tmp_path):
    holder = start("-c", HOLD_STORE_LOCK, str(tmp_path))
    try:
        assert holder.stdout.readline().strip() == "locked", holder.stderr.read()
        with pytest.raises(RunLockedError) as err:
            RunStore(tmp_path, "p", "m").lock().acquire()
        said = str(err.value)
        assert f"another process (pid {holder.pid} on host {socket.gethostname()}, since 20" in said
        assert str(tmp_path / "p" / "models" / "m") in said
        RunStore(tmp_path, "p", "other").lock().acquire().release()  # other runs are free
    finally:
        kill(holder)
    # The holder was SIGKILLed; its lock is gone with it and the file, still there, now names this process.
    lock = RunStore(tmp_path, "p", "m").lock().acquire()
    assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    with pytest.raises(RunLockedError, match="another backend of this same process"):
        RunStore(tmp_path, "p", "m").lock().acquire()
    lock.release()
    RunStore(tmp_path, "p", "m").lock().acquire().release()


async def test_a_second_trainer_fails_at_once_and_a_killed_trainers_run_is_taken_over(tiny_model_dir, tmp_path):
    holder = start(str(HERE / "run_lock_holder.py"), str(tmp_path), tiny_model_dir)
    try:
        line = holder.stdout.readline()
        assert json.loads(line or "{}").get("registered"), holder.stderr.read()
        # A second trainer of the same run: refused at register, before any model loads (its base model
        # does not even exist: loading it would have raised ModelNotFoundError instead).
        second = gw.TrainableModel(name="agent", project="p", base_model=str(tmp_path / "no-such-model"))
        backend = gw.LocalBackend(path=str(tmp_path))
        with pytest.raises(RunLockedError, match=f"pid {holder.pid} on host"):
            await second.register(backend)
        await backend.close()
    finally:
        kill(holder)
    # The killed trainer's lock is taken over: this process trains the run now.
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        assert await model.get_step() == 0
        assert json.loads((model.run_dir / ".writer.lock").read_text())["pid"] == os.getpid()
    finally:
        await backend.close()
    RunStore(tmp_path, "p", "agent").lock().acquire().release()  # close() released it
