"""`groupwise train <env> --seeds ... --run-processes each`: a process per run on the sweep's one shared worker
(jobs/train_processes.py), with real processes on the CPU. Each run trains what the one-process sweep trains
(the same sampled tokens, with the engine's batch-invariant mode), one worker holds the model for all of
them, and a run whose process is killed ends alone: the table says how, the other runs finish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from groupwise.errors import ConfigError
from groupwise.jobs.train import TrainJob

SWEEP = ["train", "2048", "--steps", "2", "--device", "cpu", "--groups-per-step", "1", "--rollouts-per-group", "2",
         "--batch-invariant"]


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of each live child process of `pid` (Linux's /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                out.append((int(child), Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode()))
            except FileNotFoundError:  # it ended meanwhile
                pass
    return out


def sampled(run_dir: Path, split: str, step: int) -> list[list[int]]:
    """The token ids of every assistant turn the run's rollouts sampled at that split and step."""
    out = []
    for line in (run_dir / "trajectories" / split / f"{step:04d}.jsonl").read_text().splitlines():
        for t in json.loads(line)["trajectories"]:
            out.append([i for m in t["messages_and_choices"] if "token_ids" in m for i in m["token_ids"]])
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds the runs' processes in Linux's /proc")
def test_a_process_per_run_trains_what_one_process_does_on_one_worker_and_outlives_a_killed_run(tmp_path,
                                                                                              tiny_model_dir):
    cli = subprocess.Popen([sys.executable, "-m", "groupwise", *SWEEP, "--model", tiny_model_dir, "--path",
                            str(tmp_path / "each"), "--seeds", "0-2", "--run-processes", "each"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines: list[str] = []
    killed = None
    try:
        for line in cli.stdout:
            lines.append(line)
            if killed is None and "] step 1/2 ·" in line:  # every run is past its start: kill one run's process
                procs = children(cli.pid)
                runs = [pid for pid, cmd in procs if "spawn_main" in cmd]
                workers = [pid for pid, cmd in procs if "groupwise.backend.processes" in cmd]
                assert len(runs) == 3 and len(workers) == 1, procs  # one worker holds the model for every run
                killed = runs[1]
                os.kill(killed, signal.SIGKILL)
        assert cli.wait(timeout=600) == 0, "".join(lines)
    finally:
        cli.kill()
    out = "".join(lines)
    assert killed is not None, out
    assert "each run's driver in a process of its own" in out
    assert "(this process, the worker and each run's process, summed)" in out  # the peak counts every process
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| 2048-s")}
    assert sorted(rows) == ["2048-s0", "2048-s1", "2048-s2"], out
    failed = [name for name, row in rows.items() if "failed:" in row]
    assert len(failed) == 1 and "killed by signal 9" in rows[failed[0]], out
    finished = sorted(set(rows) - set(failed))
    for name in rows:  # each run's process says when its run is on the worker
        assert f"[groupwise train] [{name}] loaded in " in out
    for name in finished:
        assert "| max_steps |" in rows[name], rows[name]
        assert f"[groupwise train] [{name}] step 2/2 ·" in out
        summary = json.loads((tmp_path / "each" / "2048" / "models" / name / "summary.json").read_text())
        assert summary["final_step"] == 2 and summary["run"] == name

    # the same runs from one process (the engine a core process of its own too): the same samples
    from groupwise.cli import main

    seeds = ",".join(name.removeprefix("2048-s") for name in finished)
    assert main([*SWEEP, "--steps", "1", "--model", tiny_model_dir, "--path", str(tmp_path / "one"), "--seeds", seeds,
                 "--run-processes", "one", "--engine-process", "separate"]) == 0
    for name in finished:
        each, one = (tmp_path / mode / "2048" / "models" / name for mode in ("each", "one"))
        for split, step in (("val", 0), ("train", 0)):
            assert sampled(each, split, step) == sampled(one, split, step), (name, split)
            assert sampled(each, split, step), (name, split)


def test_how_a_sweep_drives_its_runs_is_checked_and_auto_is_a_process_per_run_only_on_cuda_with_big_steps(tmp_path, monkeypatch):
    import torch

    from groupwise.jobs.train_sweep import run_processes_for

    with pytest.raises(ConfigError, match="--run-processes each sets how a sweep's runs are driven"):
        TrainJob("2048", run_processes="each")
    with pytest.raises(ConfigError, match="drop --engine-process in_process"):
        TrainJob("2048", seeds=[0, 1], run_processes="each", engine_process="in_process")
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cpu")) == "one"
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cpu", run_processes="each")) == "each"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # nothing is started
    # the 2048 preset's steps (3 x 8 rollouts) are too small for a process per run to pay; 8 x 8 are not
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cuda")) == "one"
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cuda", groups_per_step=8)) == "each"
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cuda", groups_per_step=7)) == "one"
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cuda", rollouts_per_group=16, groups_per_step=4)) == "each"
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cuda", run_processes="one")) == "one"
    # a local judge of another model is served by the process that asks: one copy in one process, not one per run
    judged = TrainJob("titles", seeds=[0, 1], device="cuda", judge=["local/qwen2.5-0.5b"])
    assert run_processes_for(judged) == "one"
    assert run_processes_for(TrainJob("titles", seeds=[0, 1], device="cuda", judge=["local/smollm2-135m"],
                                      groups_per_step=16)) == "each"
    with pytest.raises(ConfigError, match="would load the judge local/qwen2.5-0.5b once in each run's process"):
        TrainJob("titles", seeds=[0, 1], device="cuda", judge=["local/qwen2.5-0.5b"], run_processes="each")
    # an in-process engine keeps every run's requests in this process: auto keeps the runs here too
    assert run_processes_for(TrainJob("2048", seeds=[0, 1], device="cuda", engine_process="in_process",
                                      groups_per_step=8)) == "one"
    from groupwise.jobs.train_setup import job_backend

    job = TrainJob("2048", seeds=[0, 1], device="cpu", run_processes="each", path=str(tmp_path))
    assert job_backend(job, job.preset(), runs=2, separate=True).engine_process == "separate"
    joined = job_backend(job, job.preset(), join="ipc:///nowhere/commands")
    assert joined.join == "ipc:///nowhere/commands" and joined.engine_process == "separate"


def hold(send) -> None:
    time.sleep(60)


def test_a_run_process_that_ends_without_a_row_gets_one_saying_how(tmp_path):
    """`_collect` reads each run's row or notices its process ended without one (killed before it reported),
    and then no run waits for it at the start barrier."""
    import multiprocessing
    import threading

    from groupwise.jobs import train_processes

    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=hold, args=(send,))  # a run's process, holding the sending end
    proc.start()
    send.close()
    met: list[str] = []

    def another_run() -> None:  # at the start barrier
        try:
            start.wait()
            met.append("all")
        except threading.BrokenBarrierError:
            met.append("broken")

    waiting = threading.Thread(target=another_run, daemon=True)
    waiting.start()
    os.kill(proc.pid, signal.SIGKILL)
    assert train_processes._collect([proc], [receive], start) == [None]
    waiting.join(10)
    assert met == ["broken"] and proc.exitcode == -signal.SIGKILL


def test_ctrl_c_ends_every_run_at_its_checkpoint_and_the_same_command_resumes_them(tmp_path, tiny_model_dir):
    """Ctrl-C reaches every process of the terminal's group: the runs' processes end their step at its
    checkpoint, the shared worker (which ignores it) serves them until the job's process closes it, and the
    job exits 130. A worker that stopped at once left the runs waiting on it (the job ended only when it
    terminated them, its tracebacks on the terminal)."""
    import groupwise as gw
    from groupwise.cli import main

    command = [*SWEEP, "--steps", "3", "--model", tiny_model_dir, "--path", str(tmp_path), "--seeds", "0-1",
               "--run-processes", "each"]
    cli = subprocess.Popen([sys.executable, "-m", "groupwise", *command], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, cwd=tmp_path, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        for line in cli.stdout:
            lines.append(line)
            if "] step 1/3 ·" in line and len([x for x in lines if "] step 1/3 ·" in x]) == 1:
                os.killpg(cli.pid, signal.SIGINT)
        code = cli.wait(timeout=100)
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)
    out = "".join(lines)
    assert code == 130 and "groupwise train: interrupted" in out, out
    assert "Traceback" not in out and "terminated" not in out, out
    assert main(command) == 0
    for seed in (0, 1):
        history = gw.load_history(tmp_path / "2048" / "models" / f"2048-s{seed}")
        assert [r["step"] for r in history if r["split"] == "train"] == [0, 1, 2], seed  # each step once
