"""The client side stays light (no torch), the CLI helps everywhere, inspect prints a run, Ctrl-C is clean."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from groupwise.cli import build_parser, main
from groupwise.runs.store import RunStore


def run_python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout)


def test_import_groupwise_client_side_does_not_import_torch():
    proc = run_python("""
        import sys
        import groupwise, groupwise.rollout.gather, groupwise.runs.store, groupwise.model, groupwise.utils
        import groupwise.runs.transcript, groupwise.cli
        groupwise.Trajectory, groupwise.gather_trajectory_groups, groupwise.load_trajectories, groupwise.Model
        heavy = sorted(m for m in ("torch", "transformers", "peft", "numpy") if m in sys.modules)
        print("HEAVY", heavy)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


@pytest.mark.parametrize("command", [[], ["inspect"], ["serve"], ["report"], ["compare"], ["train"], ["sft"],
                                     ["dashboard"], ["judge"], ["judge", "eval"]])
def test_help_works_everywhere(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([*command, "--help"])
    assert exit_.value.code == 0
    assert "usage: groupwise" in capsys.readouterr().out


def test_every_command_is_a_job_with_a_dataclass_and_a_run():
    """The parser is made from the jobs (nested commands included): each runnable command carries its
    `Command`, whose job is a dataclass with help on every field and whose `run` is callable."""
    import dataclasses

    from groupwise.jobs.fields import Command

    def commands(parser, prefix=()):  # (name, parser) of every runnable command, nested ones included
        for action in parser._actions:
            if not isinstance(action.choices, dict):  # only subparsers map names to parsers
                continue
            for name, child in action.choices.items():
                if child.get_default("_command") is None:
                    yield from commands(child, (*prefix, name))
                else:
                    yield " ".join((*prefix, name)), child

    found = dict(commands(build_parser()))
    assert set(found) == {"inspect", "serve", "report", "compare", "train", "sft", "audit", "dashboard", "judge eval"}
    for name, parser in found.items():
        command = parser.get_default("_command")
        assert isinstance(command, Command) and command.name == name and callable(command.run)
        for f in dataclasses.fields(command.job):
            assert f.metadata.get("help"), f"{name}: --{f.name} has no help"


def test_envs_do_not_import_the_jobs_that_use_them():
    proc = run_python("""
        import sys
        import groupwise.envs
        print("JOBS", sorted(m for m in sys.modules if m.startswith("groupwise.jobs")))
    """)
    assert proc.returncode == 0, proc.stderr
    assert "JOBS []" in proc.stdout


def test_inspect_prints_a_run(tmp_path, group, capsys):
    store = RunStore(tmp_path, "2048", "agent")
    store.write_trajectories("val", 0, [group])
    store.write_trajectories("val", 5, [group])
    code = main(["inspect", str(store.run_dir), "--split", "val", "--worst", "-n", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "val · step 5" in out and "step 0" not in out                  # the latest step by default
    assert "1 group, 2 trajectories, 1 exception, mean reward 0.5" in out
    assert "steps stored: 0…5 (2)" in out
    assert "reward 0.25" in out and "reward 0.75" not in out              # --worst -n 1
    assert "→ move({\"direction\": \"left\"})" in out                     # tool call
    assert "(result of call_1)" in out and "moved left" in out            # tool result
    assert "3 tokens" in out and "mean logprob -0.508" in out             # (-0.015625 - 1.0) / 2
    assert "side conversation 1 of 1" in out
    assert "RULER: best of the group" in out                              # logs / judge explanation
    assert "ValueError: rollout 3 failed" in out
    assert "\x1b[" not in out                                             # no colour when not a tty


def test_inspect_missing_or_corrupt_runs_fail_with_a_message(tmp_path, group, capsys):
    assert main(["inspect", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("train", 0, [group])
    path.write_text("{not json\n")
    assert main(["inspect", str(store.run_dir)]) == 1
    assert "0000.jsonl:1: corrupt record" in capsys.readouterr().err


def test_ctrl_c_cancels_every_rollout_without_warnings():
    proc = run_python("""
        import asyncio, os, signal
        import groupwise as gw
        # A process started in the background (nohup, `&`, some CI runners) inherits SIGINT ignored,
        # and then Python never raises KeyboardInterrupt: restore the default so Ctrl-C is what we test.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cancelled = 0
        async def slow():
            global cancelled
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled += 1
                raise
        async def main():
            groups = [gw.TrajectoryGroup(slow() for _ in range(18)) for _ in range(3)]
            asyncio.get_running_loop().call_later(0.2, os.kill, os.getpid(), signal.SIGINT)
            await gw.gather_trajectory_groups(groups, pbar_desc=None)
        try:
            asyncio.run(main())
        except KeyboardInterrupt:
            print("INTERRUPTED", cancelled)
    """)
    assert "INTERRUPTED 54" in proc.stdout, proc.stdout + proc.stderr
    assert "Task was destroyed" not in proc.stderr and "never awaited" not in proc.stderr, proc.stderr
