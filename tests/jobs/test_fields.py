"""The CLI is generated from the jobs' dataclasses: a field is a flag (name, type, default, help, choices,
bounds, list syntax), a job built in Python is checked as the command line checks it, and adding a flag is
adding one field."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Literal

import pytest

from groupwise.cli import COMMANDS, _Parser, add_command, build_parser
from groupwise.errors import ConfigError
from groupwise.jobs.fields import Command, Job, arg, flags


@dataclass
class SweepJob(Job):
    run_dir: str = arg(help="a run folder", positional=True)
    n: int = arg(3, low=1, help="how many")
    rate: float = arg(1e-3, low=0, low_open=True, help="a rate")
    mode: Literal["fast", "exact"] = arg("fast", help="how")
    seeds: list[int] = arg(default_factory=lambda: [0], low=0, help="seeds, e.g. 0-3 or 0,2")
    lrs: list[float] | None = arg(None, low=0, low_open=True, help="rates to sweep, e.g. 5e-4,1e-3")
    judge: list[str] | None = arg(None, repeat=True, help="a judge (repeatable)")
    verbose: bool = arg(False, help="say more")
    name: str | None = arg(None, check=lambda v: None if "@" not in v else f"no '@' in a name, got {v!r}",
                           help="a name")


def parser_for(job: type, run=lambda job: 0) -> argparse.ArgumentParser:
    root = _Parser(prog="groupwise")
    add_command(root.add_subparsers(dest="_word"), Command("sweep", job, run, help="a test job"), "sweep")
    return root


def parse(job: type, *argv: str):
    ns = parser_for(job).parse_args(["sweep", *argv])
    return ns._command.job(**{k: v for k, v in vars(ns).items() if not k.startswith("_")})


def test_a_field_is_a_flag_with_its_type_default_and_help():
    specs = {s.name: s for s in flags(SweepJob)}
    assert [s.flag for s in specs.values()] == ["run_dir", "-n", "--rate", "--mode", "--seeds", "--lrs", "--judge",
                                                "--verbose", "--name"]
    assert (specs["n"].kind, specs["seeds"].many, specs["lrs"].optional, specs["mode"].choices) == (
        int, True, True, ("fast", "exact"))
    job = parse(SweepJob, "runs/a")
    assert job == SweepJob("runs/a")  # every flag left out takes the dataclass's default, the only one
    job = parse(SweepJob, "runs/a", "-n", "5", "--rate", "2e-3", "--mode", "exact", "--seeds", "0-3,7",
                "--lrs", "5e-4,1e-3", "--judge", "a", "--judge", "b", "--verbose", "--name", "x")
    assert job == SweepJob("runs/a", n=5, rate=2e-3, mode="exact", seeds=[0, 1, 2, 3, 7], lrs=[5e-4, 1e-3],
                           judge=["a", "b"], verbose=True, name="x")
    text = parser_for(SweepJob)._subparsers._group_actions[0].choices["sweep"].format_help()
    assert "how many (default: 3)" in text and "seeds, e.g. 0-3 or 0,2 (default: 0)" in text
    assert "{fast,exact}" in text and "(default: fast)" in text
    assert "a name (default" not in text  # None: the help says what leaving it out does


@pytest.mark.parametrize("argv, message", [
    (["-n", "0"], "argument -n: must be an integer >= 1, got '0'"),
    (["-n", "two"], "argument -n: must be an integer >= 1, got 'two'"),
    (["--rate", "nan"], "argument --rate: must be a finite number > 0, got 'nan'"),
    (["--mode", "slow"], "argument --mode: must be one of fast, exact, got 'slow'"),
    (["--seeds", "0,-1"], "argument --seeds: must be an integer >= 0, got '-1'"),
    (["--lrs", "1e-3,0"], "argument --lrs: must be a finite number > 0, got '0'"),
    (["--name", "a@b"], "argument --name: no '@' in a name, got 'a@b'"),
])
def test_the_command_line_refuses_a_value_with_the_fields_requirement(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(SweepJob, "runs/a", *argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_job_built_in_python_is_refused_as_the_command_line_would_refuse_it():
    with pytest.raises(ConfigError) as info:
        SweepJob("runs/a", n=0, rate=float("inf"), mode="slow", seeds=[1, -2], name="a@b", verbose="yes")
    assert info.value.problems == [
        "-n: must be an integer >= 1, got 0", "--rate: must be a finite number > 0, got inf",
        "--mode: must be one of fast, exact, got 'slow'", "--seeds: must be an integer >= 0, got -2",
        "--verbose: must be True or False, got 'yes'", "--name: no '@' in a name, got 'a@b'"]
    from groupwise.jobs.train import TrainJob

    with pytest.raises(ConfigError, match="--steps: must be an integer >= 1, got 0"):
        TrainJob("2048", steps=0)
    with pytest.raises(ConfigError, match="no environment 'chess'"):
        TrainJob("chess")
    with pytest.raises(ConfigError, match="need --judge-labels"):
        TrainJob("titles", judge=["local/a", "local/b"])


def test_adding_a_flag_is_adding_a_field():
    @dataclass
    class WiderJob(SweepJob):
        warmup: int = arg(0, low=0, help="steps of warm-up")

    assert "--warmup" not in parser_for(SweepJob).format_help() + str(flags(SweepJob))
    assert parse(WiderJob, "runs/a", "--warmup", "4").warmup == 4
    assert parse(WiderJob, "runs/a").warmup == 0
    with pytest.raises(SystemExit):
        parse(WiderJob, "runs/a", "--warmup", "-1")


def test_every_commands_help_leaves_the_default_to_the_field():
    """A default written in a help text as well as in the field drifts: the CLI appends the field's."""
    for command in COMMANDS:
        for spec in flags(command.job):
            assert spec.help, f"{command.name} {spec.flag} has no help"
            if spec.default not in (dataclasses.MISSING, None, False, []):
                shown = spec.help_text().rsplit(" (default: ", 1)[1]
                assert f"default {shown[:-1]}" not in spec.help and f"default: {shown[:-1]}" not in spec.help, (
                    command.name, spec.flag)


def test_the_generated_parser_keeps_every_flag_of_the_commands():
    """The flags users and scripts (bench/, the README) spell, each still accepted."""
    parser = build_parser()
    for argv in (["train", "2048", "--lr", "1e-3", "--seed", "7", "--steps", "8", "--sft", "4", "--sft-epochs", "1",
                  "--sft-lr", "1e-4", "--judge", "local/m", "--judge-labels", "env", "--judge-margin", "0.1",
                  "--gate", "--batch-invariant", "--dtype", "bf16", "--device", "cpu", "--name", "r", "--path", "p",
                  "--model", "m"],
                 ["sft", "email", "-n", "8", "--epochs", "1", "--lr", "1e-4", "--batch-size", "2", "--project", "p"],
                 ["serve", "--model", "m", "--adapter", "a", "--adapter", "b", "--port", "0", "--max-kv-gb", "0.5",
                  "--max-batch-size", "4", "--max-body-bytes", "10", "--name", "n", "--api-key", "k", "--host", "h"],
                 ["inspect", "r", "--split", "val", "--step", "2", "--worst", "-n", "1", "--skip-corrupt"],
                 ["report", "r", "--out", "o", "--wandb", "w", "--tensorboard", "t"],
                 ["compare", "r", "--steps", "0,best", "--split", "val", "-n", "2"],
                 ["dashboard", "p", "--port", "0", "--host", "h", "--api-key", "k"],
                 ["judge", "eval", "--labels", "titles", "--judge", "a", "--rubric", "r", "--base-url", "u",
                  "--api-key", "k", "--metric", "m", "--groups", "2", "--orders", "1", "--repeats", "1",
                  "--margin", "0", "--max-concurrent", "1", "--seed", "1", "--json", "j", "--plot", "p"]):
        ns = parser.parse_args(argv)
        given = {a.lstrip("-").replace("-", "_") for a in argv if a.startswith("-")}
        assert given <= set(vars(ns)), (argv, sorted(given - set(vars(ns))))


def test_a_flag_that_feeds_a_config_field_is_derived_from_it():
    """A flag that sets a config field takes that field's help and default (`arg(feeds=...)`): every
    command's flags agree with their fields, and a flag that restates a default, or states another one
    without saying why, is named."""
    from groupwise.config import LoopConfig, TrainConfig, TrainSFTConfig
    from groupwise.core.validated import field_default, field_help
    from groupwise.jobs.fields import config_drift

    feeding = [(c.name, s) for c in COMMANDS for s in flags(c.job) if s.meta["feeds"] is not None]
    assert {(name, s.name) for name, s in feeding} >= {("train", "seed"), ("train", "lr"), ("train", "sft_lr"),
                                                       ("sft", "lr"), ("sft", "seed"), ("sft", "batch_size")}
    assert {c.name: config_drift(c.job) for c in COMMANDS} == {c.name: [] for c in COMMANDS}
    seed = next(s for name, s in feeding if (name, s.name) == ("train", "seed"))
    assert seed.default == field_default(LoopConfig, "seed") and seed.help.startswith(field_help(LoopConfig, "seed"))

    @dataclass
    class Drifted(Job):
        derived: float = arg(feeds=(TrainConfig, "learning_rate"))
        restated: float = arg(3e-5, feeds=(TrainConfig, "learning_rate"), help="a rate")
        said: float = arg(field_default(TrainSFTConfig, "learning_rate"), feeds=(TrainSFTConfig, "learning_rate"),
                          own_default="differs, it says")
        warm: float = arg(2e-4, feeds=(TrainSFTConfig, "learning_rate"), own_default="a warm start's")

    assert Drifted.__dataclass_fields__["derived"].default == field_default(TrainConfig, "learning_rate")
    drift = config_drift(Drifted)
    assert len(drift) == 2 and drift[0].startswith("Drifted.restated (--restated, feeds TrainConfig.learning_rate): "
                                                   "default 3e-05, the field's is 1e-05")
    assert drift[1].startswith("Drifted.said") and "own_default says it differs" in drift[1]
    # a help written again rather than derived: the field's help no longer heads it
    spec = next(s for s in flags(Drifted) if s.name == "warm")
    spec.meta["help"] = spec.help
    object.__setattr__(spec, "help", "learning rate")
    with pytest.MonkeyPatch.context() as m:
        m.setattr("groupwise.jobs.fields.flags", lambda job: [spec])
        assert config_drift(Drifted) == ["Drifted.warm (--warm, feeds TrainSFTConfig.learning_rate): its help does "
                                         "not begin with the field's help"]
    with pytest.raises(Exception, match="has no field 'rate'"):
        arg(feeds=(TrainConfig, "rate"))
