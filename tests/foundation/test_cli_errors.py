"""CLI errors are one clear line and exit code 2, before any model is loaded (real processes); the
store's warnings reach the terminal as one line each; `inspect --skip-corrupt`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from groupwise.runs.store import RunStore


def groupwise(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENAI_API_KEY="")
    return subprocess.run([sys.executable, "-m", "groupwise.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


# A model that does not exist: a command that got as far as loading would fail on it instead. Shaped
# as a Hugging Face id, which only loading can check (a missing local path is refused up front).
NO_MODEL = "no-such-org/model-that-would-fail-to-load"


@pytest.mark.parametrize("args, needle", [
    (["train", "2048", "--steps", "-1", "--model", NO_MODEL], "argument --steps: must be an integer >= 1, got '-1'"),
    (["train", "2048", "--steps", "ten"], "argument --steps: must be an integer >= 1, got 'ten'"),
    (["train", "2048", "--sft-lr", "-3"], "argument --sft-lr: must be a finite rate > 0 or a list of them, got '-3'"),
    (["train", "nope", "--model", NO_MODEL], "nope"),
    (["train", "2048", "--judge", "openai/o4-mini", "--model", NO_MODEL], "OPENAI_API_KEY"),
    (["train", "2048", "--judge", "acme/judge", "--model", NO_MODEL], "unknown judge provider 'acme'"),
    (["train", "titles", "--judge", "local/a", "--judge", "local/b", "--model", NO_MODEL], "need --judge-labels"),
    (["serve", "--model", NO_MODEL, "--host", "0.0.0.0"], "--api-key KEY is required"),
    (["serve", "--model", NO_MODEL, "--port", "70000"], "argument --port: must be an integer in [0, 65535]"),
    (["serve", "--model", NO_MODEL, "--max-body-bytes", "0"], "argument --max-body-bytes"),
    (["inspect", ".", "-n", "0"], "argument -n: must be an integer >= 1"),
    (["sft", "x.jsonl", "--epochs", "0"], "argument --epochs"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_argument_errors_are_one_line_and_exit_2_before_loading(args, needle):
    proc = groupwise(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr  # no usage block, no traceback
    assert needle in lines[0] and lines[0].startswith("groupwise")
    assert NO_MODEL not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, needle", [
    (["train", "2048", "--sft", "-5"], "argument --sft: must be an integer >= 0, got '-5'"),
    (["train", "2048", "--name", "../../x"], "argument --name: '../../x' cannot be a folder name of the run store"),
    (["train", "2048", "--name", "a@b"], "argument --name: must be a non-empty name without '@'"),
    (["sft", "email", "--name", "../x"], "argument --name: '../x' cannot be a folder name"),
    (["sft", "email", "--project", "/etc"], "argument --project: '/etc' cannot be a folder name"),
    (["train", "2048", "--device", "tpu"], "argument --device: must be cpu, cuda, cuda:N or mps, got 'tpu'"),
    (["train", "2048", "--device", "cuda:99"], "--device cuda:99: "),  # no CUDA here, or fewer than 100
    (["train", "2048", "--device", "cpu\n"], "argument --device: must be cpu, cuda, cuda:N or mps, got 'cpu\\n'"),
    (["train", "2048", "--dtype", "int3"], "argument --dtype: must be one of float32, bfloat16, float16"),
    (["serve", "--dtype", "int3"], "argument --dtype: must be one of float32, bfloat16, float16"),
    (["serve", "--name", "a@b"], "argument --name: must be a non-empty name without '@' (it separates the step"),
    (["serve", "--model", "/missing/model"], "--model /missing/model: does not exist; a local model is a folder"),
    (["serve", "--model", "{file}"], "is a file; a local model is a folder with config.json"),
    (["train", "2048", "--model", "./no-such-folder"], "--model ./no-such-folder: does not exist"),
    (["train", "2048", "--path", "{file}"], "is a file, not a folder; the run store is a folder of runs"),
    (["sft", "email", "--path", "{file}/runs"], "is a file, not a folder"),
    (["sft", "{file}.jsonl"], "{file}.jsonl: no such file"),
    (["sft", "2048"], "2048: env '2048' has no scripted demonstrator; these have one: email"),
    (["sft", "chess"], "chess: neither a JSONL file nor an env with a scripted demonstrator (email, tictactoe, tictactoe-minimax)"),
])
def test_caller_errors_found_by_the_hostile_test_are_one_line_before_loading(tmp_path, args, needle):
    """Each of these used to print a traceback, several after the model had loaded."""
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    if "--model" not in args:
        args = [*args, "--model", NO_MODEL]
    proc = groupwise(*(a.replace("{file}", str(file)) for a in args))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle.replace("{file}", str(file)) in lines[0] and lines[0].startswith("groupwise")
    assert NO_MODEL not in proc.stderr


def test_a_second_trainer_of_a_run_is_one_line_naming_the_holder(tmp_path):
    """`groupwise train` on a run another process trains: refused at once, before its model loads."""
    import socket

    lock = RunStore(tmp_path, "2048", "busy").lock().acquire()  # this test process trains it
    try:
        proc = groupwise("train", "2048", "--path", str(tmp_path), "--name", "busy", "--model", NO_MODEL)
    finally:
        lock.release()
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("groupwise: warning")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in lines[0] and NO_MODEL not in lines[0]


def test_inspect_skip_corrupt_and_one_line_warnings(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("val", 0, [group, group])
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][:50] + "\n")  # the second group's line is cut short
    proc = groupwise("inspect", str(store.run_dir))
    assert proc.returncode == 1 and "0000.jsonl:2: corrupt record" in proc.stderr and "--skip-corrupt" in proc.stderr
    proc = groupwise("inspect", str(store.run_dir), "--skip-corrupt")
    assert proc.returncode == 0, proc.stderr
    assert "1 group, 2 trajectories" in proc.stdout
    assert proc.stderr.strip().splitlines() == [f"groupwise: warning: {path}:2: skipped (a line cut short by a crash "
                                                "mid-write)"]


def test_report_warns_about_a_torn_history_line(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    for step in range(3):
        store.append_history({"step": step, "split": "val", "reward": 0.1 * step, "accuracy": 0.5})
    with open(store.history_path, "a") as f:
        f.write('{"step": 3, "split": "va')  # killed mid-append
    proc = groupwise("report", str(store.run_dir), "--out", str(tmp_path / "plots"))
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("groupwise: warning:")]
    assert warnings == [f"groupwise: warning: {store.history_path}:4: skipped (a line cut short by a crash mid-write)"]


def test_python_dash_m_groupwise_is_the_command():
    """`python -m groupwise` is how many run a package's command (a venv without its scripts on PATH)."""
    proc = subprocess.run([sys.executable, "-m", "groupwise", "train", "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: groupwise train")


@pytest.mark.parametrize("args, needle", [
    (["train", "2048", "--seeds", "3-1"], "argument --seeds: the range '3-1' runs backwards; write 1-3"),
    (["train", "2048", "--seeds", "0,2-x"], "argument --seeds: must be an integer, got '2-x'"),
    (["train", "2048", "--path", "/proc/groupwise-runs"], "/proc/groupwise-runs"),
])
def test_mistakes_a_newcomer_makes_are_one_line_before_loading(args, needle):
    proc = groupwise(*args, "--model", NO_MODEL)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in lines[0] and lines[0].startswith("groupwise"), lines[0]
    assert NO_MODEL not in proc.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a folder of mode 0o555")
def test_a_run_store_this_user_cannot_write_is_refused_before_loading(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    proc = groupwise("train", "2048", "--path", str(locked / "runs"), "--model", NO_MODEL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"groupwise train: error: --path {locked / 'runs'}: {locked} cannot be written here (read-only, or not "
        "yours); pass a writable folder"]


def test_a_run_store_under_a_file_is_refused_before_loading(tmp_path):
    # what root meets too (the test above is skipped for root, who may write in any folder)
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    proc = groupwise("train", "2048", "--path", str(afile / "runs"), "--model", NO_MODEL)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"groupwise train: error: --path {afile / 'runs'}: {afile} is a file, not a folder; the run store is a "
        "folder of runs"]


def test_a_folder_this_user_may_not_write_is_named_with_what_to_do(tmp_path, monkeypatch):
    # the check behind the skipped test above, in this process, whoever runs it
    from groupwise.jobs import common

    locked = tmp_path / "locked"
    locked.mkdir()
    monkeypatch.setattr(common.os, "access", lambda path, mode: str(path) != str(locked))
    assert common.store_problem(str(locked / "runs" / "deeper")) == (
        f"{locked} cannot be written here (read-only, or not yours); pass a writable folder")
    assert common.store_problem(str(tmp_path / "fine")) is None


@pytest.mark.parametrize("command", ["report", "inspect", "compare"])
def test_a_reader_pointed_at_a_store_or_a_project_names_the_runs_there(tmp_path, command):
    """`groupwise report .groupwise` (the folder the train job names) is a natural first guess."""
    for name in ("2048-s0", "2048-s1"):
        RunStore(tmp_path, "2048", name).append_history({"step": 0, "split": "val", "reward": 0.5})
    for given, shown in ((tmp_path, "2048/models/2048-s0, 2048/models/2048-s1"),
                         (tmp_path / "2048", "models/2048-s0, models/2048-s1"),
                         (tmp_path / "2048" / "models", "2048-s0, 2048-s1")):
        proc = groupwise(command, str(given))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"groupwise {command}: error: {given}: is not a run folder; the runs under it: {shown}; pass one, e.g. "
            f"{tmp_path / '2048' / 'models' / '2048-s0'}"]
    proc = groupwise(command, str(tmp_path / "nothing-here"))
    assert proc.returncode == 2 and "does not exist; pass a run folder" in proc.stderr, proc.stderr


def test_compare_on_a_run_without_validation_names_the_splits_it_has(tmp_path, group):
    store = RunStore(tmp_path, "titles", "titles-s0")
    store.append_history({"step": 0, "split": "train", "reward": 0.5})
    store.write_trajectories("train", 0, [group])
    proc = groupwise("compare", str(store.run_dir))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "groupwise compare: error: this run stores no val trajectories; pass --split with one it has: train"]


def test_serve_given_a_run_folder_names_its_checkpoint(tmp_path):
    """`groupwise serve --adapter RUN` (the folder the train job prints) said only 'no adapter_config.json'."""
    run = RunStore(tmp_path, "2048", "2048-s0")
    run.append_history({"step": 0, "split": "val", "reward": 0.5})
    for step in ("0001", "0002"):
        (run.checkpoints_dir / step).mkdir(parents=True)
        (run.checkpoints_dir / step / "adapter_config.json").write_text("{}")
    for given in (run.run_dir, tmp_path):
        proc = groupwise("serve", "--model", NO_MODEL, "--adapter", str(given))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"groupwise serve: error: --adapter {given}: no adapter_config.json there; a run's checkpoints are its "
            f"adapters: pass one, e.g. {run.checkpoints_dir / '0002'}"]
    proc = groupwise("serve", "--model", NO_MODEL, "--adapter", str(tmp_path / "missing"))
    assert proc.returncode == 2 and ": does not exist (expected a peft LoRA folder" in proc.stderr, proc.stderr
