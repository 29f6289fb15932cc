"""kill -9 under the pipelined loop on a real tiny model: inside a GRPO update (the next batch being
gathered meanwhile) and inside a checkpoint write. The resumed run ends at its last step with every
history row once, every step's checkpoint intact, and a training batch stored for every step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import groupwise as gw
from groupwise.runs.history import history_key

pytest.importorskip("torch")
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
STEPS = 3


def worker(store: Path, model_dir: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(HERE / "pipeline_kill_worker.py"), str(store), model_dir, *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_when_hanging(proc: subprocess.Popen, store: Path) -> str:
    marker = store / "hanging"
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the worker never reached the hang"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert proc.returncode == -9
    where = marker.read_text()
    marker.unlink()
    return where


@pytest.mark.parametrize("hang, at", [("--hang-in-update", 1), ("--hang-in-save", 2)])
def test_a_pipelined_run_killed_mid_update_or_mid_checkpoint_resumes_whole(tiny_model_dir, tmp_path, hang, at):
    from groupwise.training.checkpoint import read_state, verify_checkpoint

    store = tmp_path / "store"
    where = kill_when_hanging(worker(store, tiny_model_dir, hang, str(at)), store)
    assert where.endswith(str(at))
    run = store / "kill" / "models" / "piped"
    before = gw.load_history(run)
    proc = worker(store, tiny_model_dir)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert result["final_step"] == STEPS and 0 < result["start_step"] < STEPS
    history = gw.load_history(run)
    keys = Counter(history_key(r) for r in history)
    assert [k for k, n in keys.items() if n > 1] == []  # every row once
    assert all(r in history for r in before if r["split"] != "alert")  # what the killed run wrote stays
    assert sorted(r["step"] for r in history if r["split"] == "train") == list(range(STEPS))
    assert sorted(r["step"] for r in history if r["split"] == "loop") == list(range(STEPS))
    for step in range(STEPS):
        assert gw.load_trajectories(run, "train", step), step
    folders = sorted(p for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert [int(p.name) for p in folders][-1] == STEPS
    for folder in folders:
        state = read_state(folder)
        assert state is not None and verify_checkpoint(state) is None, folder
    assert not [p for p in (run / "checkpoints").iterdir() if not p.name.isdigit() and not p.name.startswith(".")]


def test_two_processes_train_two_runs_of_one_store_at_once(tiny_model_dir, tmp_path):
    """Each process its own backend, engine and run; the store's shared parts (its folders, the base's
    files) are shared. Both finish, each run's folder holds only its own rows and steps."""
    store = tmp_path / "store"
    procs = {name: worker(store, tiny_model_dir, "--name", name) for name in ("left", "right")}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"final_step": STEPS, "start_step": 0}
    for name in procs:
        run = store / "kill" / "models" / name
        history = gw.load_history(run)
        assert sorted(r["step"] for r in history if r["split"] == "train") == list(range(STEPS))
        assert [k for k, n in Counter(history_key(r) for r in history).items() if n > 1] == []
        assert max(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == STEPS
        names = {t.messages()[0]["content"] for s in range(STEPS) for g in gw.load_trajectories(run, "train", s) for t in g}
        assert names and all(n.startswith("Count to") for n in names)
