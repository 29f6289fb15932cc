"""A run killed with SIGKILL at the worst moments, resumed, ends exactly where an uninterrupted run of
the same seed ends: the same history rows (timings aside), trajectories, optimizer and adapter, bit
for bit. Killed while writing a checkpoint; killed between a checkpoint and its history row; then a
corrupt, and then an incomplete, latest checkpoint is skipped with a warning and the step redone
without duplicating a row.
(resume_worker.py is the training process; test_local_backend.py kills one mid-update.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from history_rows import stable_rows
import torch
from safetensors.torch import load_file

import groupwise as gw

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
STEPS = 3


def _worker(store: Path, tiny_model_dir: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, str(HERE / "resume_worker.py"), str(store), tiny_model_dir, str(STEPS), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return out


def _kill_at(proc: subprocess.Popen, marker: Path) -> None:
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline, f"the worker never reached {marker.name}"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    marker.unlink()


def _history(run: Path) -> list[dict]:
    return stable_rows(gw.load_history(run))


def _same_tensors(a: Path, b: Path) -> bool:
    ta, tb = load_file(str(a)), load_file(str(b))
    return ta.keys() == tb.keys() and len(ta) > 0 and all(torch.equal(ta[k], tb[k]) for k in ta)


def _assert_same_run(run: Path, ref: Path) -> None:
    assert _history(run) == _history(ref)
    for step in range(STEPS):
        name = f"trajectories/train/{step:04d}.jsonl"
        assert (run / name).read_bytes() == (ref / name).read_bytes(), name
    last = f"checkpoints/{STEPS:04d}"
    assert _same_tensors(run / last / "optimizer.safetensors", ref / last / "optimizer.safetensors")
    assert _same_tensors(run / last / "adapter_model.safetensors", ref / last / "adapter_model.safetensors")


def test_killed_during_a_checkpoint_and_before_its_history_row_resumes_bit_identical(tiny_model_dir, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    _finish(_worker(straight, tiny_model_dir))
    ref, run = straight / "resume" / "models" / "agent", killed / "resume" / "models" / "agent"
    assert [(r["step"], r["split"]) for r in gw.load_history(ref)] == [(0, "train"), (1, "train"), (2, "train")]

    # 1. Killed while checkpoint 2 is being written (adapter and optimizer on disk, state.json not).
    proc = _worker(killed, tiny_model_dir, "--hang-in-save", "2")
    _kill_at(proc, killed / "in_save")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [".tmp-2-" + str(proc.pid), "0001"]
    assert [(r["step"], r["split"]) for r in gw.load_history(run)] == [(0, "train")]

    # 2. Resumed from checkpoint 1 (the unfinished one is named in a warning), then killed after
    #    checkpoint 3 is in place but before step 2's history row reached history.jsonl.
    proc = _worker(killed, tiny_model_dir, "--hang-before-history", "3")
    _kill_at(proc, killed / "before_history")
    out = proc.stdout.read()
    assert "is an unfinished checkpoint" in out and ".tmp-2-" in out
    assert [(r["step"], r["split"]) for r in gw.load_history(run)] == [(0, "train"), (1, "train")]
    state = json.loads((run / "checkpoints" / "0003" / "state.json").read_text())
    assert [(r["step"], r["split"]) for r in state["history"]] == [(2, "train")]  # the row travels with it

    # 3. Resumed at step 3: nothing left to train; the row is replayed from the checkpoint, and the
    #    run is the uninterrupted one, bit for bit (timings aside).
    _finish(_worker(killed, tiny_model_dir))
    _assert_same_run(run, ref)

    # 4. The latest checkpoint gets corrupted on disk: the resume skips it with a warning naming the
    #    folder and the file, redoes step 2 -> 3 from checkpoint 2, and still writes one "2 train" row.
    adapter = run / "checkpoints" / "0003" / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:1000])
    out = _finish(_worker(killed, tiny_model_dir))
    assert f"checkpoint {run / 'checkpoints' / '0003'} is corrupt (adapter_model.safetensors has 1000 bytes" in out
    assert "resumes from step 2" in out
    _assert_same_run(run, ref)
    assert (killed / "ref" / "resumed-2.safetensors").exists()  # it resumed at step 2

    # 5. An incomplete latest checkpoint (no state.json) is ignored the same way: step 2 is redone,
    #    and its history row is replaced, not duplicated.
    (run / "checkpoints" / "0003" / "state.json").unlink()
    out = _finish(_worker(killed, tiny_model_dir))
    assert "0003 is incomplete" in out
    _assert_same_run(run, ref)
