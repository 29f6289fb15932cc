"""`groupwise sft` and `groupwise train <env> --sft N`: demonstrations from a JSONL file or an env's scripted
agent become SFT steps of the run (resumed, not repeated), and GRPO continues from them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import groupwise as gw
from groupwise.cli import main
from groupwise.errors import InvalidDataError
from groupwise.envs import get_env
from groupwise.jobs.sft import env_demonstrations, read_jsonl


def test_jsonl_rows_become_trajectories_and_bad_rows_say_where(tmp_path):
    good = tmp_path / "demos.jsonl"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})
                    + "\n\n" + json.dumps({"messages": [{"role": "user", "content": "q"}], "tools": []}) + "\n")
    trajs = read_jsonl(good)
    assert [len(t.messages_and_choices) for t in trajs] == [2, 1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n{\"text\": 1}\n")
    with pytest.raises(ValueError, match="bad.jsonl:2: messages: missing; expected {\"messages\""):
        read_jsonl(bad)


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])
def test_a_demonstration_holding_a_unicode_line_separator_is_one_row(tmp_path, separator):
    # JSONL written with ensure_ascii=False (most datasets) keeps U+2028 or NEL raw inside its strings;
    # the file was split with str.splitlines, which breaks lines there, so a valid file was refused
    # ("demos.jsonl:1: not an SFT row"). Files are read as UTF-8 whatever the locale, too.
    row = {"messages": [{"role": "user", "content": f"a{separator}b"}, {"role": "assistant", "content": "ok"}]}
    path = tmp_path / "demos.jsonl"
    path.write_bytes((json.dumps(row, ensure_ascii=False) + "\n").encode())
    [t] = read_jsonl(path)
    assert t.messages_and_choices[0]["content"] == f"a{separator}b"
    path.write_bytes(b'{"messages": [{"role": "user", "content": "\xff"}]}\n')
    with pytest.raises(InvalidDataError, match="demos.jsonl:[0-9]+: not UTF-8 text"):
        read_jsonl(path)


def test_env_demonstrations_come_from_the_scripted_agent():
    demos = env_demonstrations(get_env("email"), 3, seed=0)
    assert len(demos) == 3 and all(d.metrics["correct"] == 1.0 for d in demos)
    first_train = get_env("email").scenarios(0)[0][0]
    assert demos[0].metadata["question_id"] == first_train.question_id
    with pytest.raises(ValueError, match="no scripted demonstrator; these have one: .*'email'"):
        env_demonstrations(get_env("2048"), 3, seed=0)


def test_groupwise_sft_makes_steps_and_resumes_without_repeating_them(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "greet.jsonl"
    data.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": f"hi {i}"},
                                                      {"role": "assistant", "content": "hello"}]}) for i in range(6)))
    args = ["sft", str(data), "--model", tiny_model_dir, "--path", str(tmp_path / "runs"), "--epochs", "2",
            "--batch-size", "3", "--name", "greeter", "--device", "cpu"]
    assert main(args) == 0
    run = tmp_path / "runs" / "sft" / "models" / "greeter"
    rows = [r for r in gw.load_history(run) if r["split"] == "sft"]
    assert [r["step"] for r in rows] == [0, 1] and all(r["updates"] == 2 for r in rows)
    assert (run / "checkpoints" / "0002" / "state.json").is_file()
    # the command it prints continues this run: its project, name, base model and run store
    (said,) = [line for line in capsys.readouterr().out.splitlines() if "continue with GRPO: " in line]
    continuation = continues(said, env="tictactoe")
    assert continuation.model == tiny_model_dir
    assert (Path(continuation.path) / continuation.project_of() / "models" / continuation.name).resolve() == run.resolve()
    assert main(args) == 0  # a second call finds its SFT steps done
    assert len([r for r in gw.load_history(run) if r["split"] == "sft"]) == 2
    assert "done: step 2 (2 SFT step(s))" in capsys.readouterr().out
    assert main(["sft", "2048", "--model", tiny_model_dir, "--path", str(tmp_path / "runs")]) == 2
    assert "no scripted demonstrator" in capsys.readouterr().err


@pytest.mark.slow
def test_train_email_with_sft_scores_the_warm_start_as_a_baseline(tiny_model_dir, tmp_path):
    from groupwise.jobs.train import TrainJob, train

    job = TrainJob("email", model=tiny_model_dir, seed=0, path=str(tmp_path), device="cpu", sft=2, sft_epochs=1, sft_lr=1e-3)
    job.steps = 0  # no GRPO step after the warm start (the CLI asks for one at least; this test only needs its baseline)
    result = _run(train(job))
    assert result["sft_steps"] == 1 and result["final_step"] == 1
    history = gw.load_history(result["run_dir"])
    assert [r["step"] for r in history if r["split"] == "sft"] == [0]
    names = [r["name"] for r in history if r["split"] == "baseline"]
    assert names == ["email-s0@0", "email-s0@1"]  # the base, then the SFT step
    assert result["sft"] is not None


def test_grpo_after_a_warm_start_begins_at_the_first_scenarios(tiny_model_dir, tmp_path, caplog):
    # the SFT steps used demonstrations, not scenarios: the first GRPO step takes the head of epoch 0's
    # order, and no "holds no data cursor" warning is printed
    from groupwise.envs import get_env
    from groupwise.jobs.train import TrainJob, train
    from groupwise.utils import epoch_order

    job = TrainJob("tictactoe", model=tiny_model_dir, seed=0, path=str(tmp_path), device="cpu", sft=2, sft_epochs=1,
                   sft_lr=1e-3, steps=1, groups_per_step=2, rollouts_per_group=2)
    with caplog.at_level("WARNING", logger="groupwise.loop"):
        result = _run(train(job))
    assert result["sft_steps"] == 1
    assert not [r for r in caplog.records if "data cursor" in r.getMessage()]
    (first,) = [r for r in gw.load_history(result["run_dir"]) if r["split"] == "loop"]
    n = len(get_env("tictactoe").scenarios(0)[0])
    assert first["step"] == 1 and first["scenarios"] == epoch_order(n, 0, 0)[:2]


def continues(line: str, env: str):
    """The TrainJob of the `groupwise train` command a line prints, its <env> placeholder as `env`."""
    import shlex

    from groupwise.cli import build_parser

    words = shlex.split(line.split("continue with GRPO: ", 1)[1])
    assert words[:2] == ["groupwise", "train"], line
    args = build_parser().parse_args([w.replace("<env>", env) for w in words[1:]])
    return args._command.job(**{k: v for k, v in vars(args).items() if not k.startswith("_")})


def test_an_env_warm_start_prints_the_command_that_continues_it(tiny_model_dir, tmp_path, capsys):
    # one demonstration, one epoch: the cheapest warm start; project and seed are not the defaults
    args = ["sft", "tictactoe", "-n", "1", "--epochs", "1", "--seed", "3", "--project", "games", "--model",
            tiny_model_dir, "--path", str(tmp_path / "runs"), "--device", "cpu"]
    assert main(args) == 0
    (said,) = [line for line in capsys.readouterr().out.splitlines() if "continue with GRPO: " in line]
    job = continues(said, env="unused")
    assert job.env == "tictactoe" and job.seed == 3 and job.model == tiny_model_dir
    run = tmp_path / "runs" / "games" / "models" / "tictactoe-s3"
    assert gw.load_history(run) and (Path(job.path) / job.project_of() / "models" / (job.name or "")).resolve() == run.resolve()


def test_a_bug_in_groupwise_sft_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    """`groupwise sft` made every KeyError and ValueError one line with exit 2: a bug lost its traceback (and
    read as the user's mistake). Only groupwise's own errors are one line."""
    import groupwise.jobs.sft as sft_job

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}))

    def buggy(path):
        return {}["no such key"]

    monkeypatch.setattr(sft_job, "read_jsonl", buggy)
    with pytest.raises(KeyError, match="no such key"):
        main(["sft", str(data), "--path", str(tmp_path / "runs")])
    monkeypatch.setattr(sft_job, "read_jsonl", lambda path: int("x"))
    with pytest.raises(ValueError, match="invalid literal"):
        main(["sft", str(data), "--path", str(tmp_path / "runs")])
    # a file the user got wrong is still one line naming file and line (groupwise's own error)
    monkeypatch.undo()
    data.write_text('{"msgs": []}\n')
    assert main(["sft", str(data), "--path", str(tmp_path / "runs")]) in (1, 2)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{data}:1" in err and "Traceback" not in err


def _run(coro):
    import asyncio

    return asyncio.run(coro)


def test_the_help_names_every_env_that_has_a_demonstrator():
    """`groupwise sft --help` named only email while tic-tac-toe had gained a scripted player."""
    from groupwise.envs import ENVS
    from groupwise.jobs.fields import flags
    from groupwise.jobs.sft import SFTJob

    data = next(f for f in flags(SFTJob) if f.name == "data")
    have = ", ".join(sorted(name for name, spec in ENVS.items() if spec.demonstrate is not None))
    assert data.help.endswith(f"an env with a scripted demonstrator ({have})")


def test_a_resumed_warm_start_with_fewer_epochs_reports_the_sft_steps_the_run_holds():
    """A run with 2 SFT steps resumed with --sft-epochs 1 reported 1: the GRPO step budget and the warm
    start's baseline (its last SFT step) were then one step off."""
    from types import SimpleNamespace

    from groupwise.jobs.sft import warm_start

    class Warm:  # a run whose two SFT steps are done (the seam: its history and step counter)
        store = SimpleNamespace(history=lambda skip_corrupt: [{"split": "sft", "step": 0}, {"split": "sft", "step": 1}])

        async def get_step(self):
            return 2

        async def train_sft(self, *args, **kwargs):
            raise AssertionError("a done SFT step was trained again")

    assert _run(warm_start(Warm(), [], epochs=1, learning_rate=1e-3, seed=0)) == 2
    assert _run(warm_start(Warm(), [], epochs=2, learning_rate=1e-3, seed=0)) == 2
