"""Every number a command takes is bounded, by the flag or by the config the value goes into, and the
command line refuses an out-of-range value in one line (exit 2) before any model loads: `--seed -1`
reached the model load and failed there, after minutes, because the job's seed had no bound while the
configs it feeds refuse it."""

from __future__ import annotations

import math
from dataclasses import MISSING

import pytest

from groupwise.cli import COMMANDS, main
from groupwise.jobs.fields import Flag, config_problem, flags

# A value for each required argument, so that only the flag under test can be wrong.
REQUIRED = {("train", "env"): "titles", ("audit", "env"): "titles", ("sft", "data"): "demos.jsonl",
            ("judge eval", "labels"): "titles"}


def required_argv(command) -> list[str]:
    argv = []
    for spec in flags(command.job):
        if spec.default is MISSING:
            value = REQUIRED.get((command.name, spec.name), "x")
            argv += [value] if spec.meta["positional"] else [spec.flag, value]
    return argv


def out_of_range(spec: Flag) -> list[object]:
    """Values of the flag's type that its bounds or its config refuse (each checked to be refused)."""
    integer = spec.kind is int
    low, high = spec.meta["low"], spec.meta["high"]
    candidates: list[object] = []
    if low is not None:
        candidates.append(low if spec.meta["low_open"] else (low - 1 if integer else low - 0.5))
    if high is not None:
        candidates.append(high if spec.meta["high_open"] else (high + 1 if integer else high + 0.5))
    if spec.meta["feeds"] is not None:
        tries = [-1, -(10**6), 0, 10**12] if integer else [-1.0, 0.0, -1e30, 1e30]
        candidates += [v for v in tries if config_problem(*spec.meta["feeds"], v)]
    return candidates


NUMERIC = [(c, s) for c in COMMANDS for s in flags(c.job) if s.kind in (int, float)]


@pytest.mark.parametrize("command, spec", NUMERIC, ids=[f"{c.name}:{s.flag}" for c, s in NUMERIC])
def test_every_number_a_command_takes_is_bounded(command, spec):
    """A numeric flag without a bound of its own or of its config passes any value to the job (`--seed -1`
    went as far as the model load)."""
    assert spec.bounded, f"groupwise {command.name} {spec.flag}: no bound (low/high) and no config it feeds"


CASES = [(c, s, v) for c, s in NUMERIC for v in out_of_range(s)]


@pytest.mark.parametrize("command, spec, value", CASES, ids=[f"{c.name}:{s.flag}={v}" for c, s, v in CASES])
def test_an_out_of_range_value_is_one_line_before_any_model_loads(command, spec, value, capsys, monkeypatch):
    import groupwise.runtime.loading

    def no_load(*args, **kwargs):
        raise AssertionError(f"{spec.flag} {value}: a model was loaded")

    monkeypatch.setattr(groupwise.runtime.loading, "load_base_model", no_load)
    monkeypatch.setenv("OPENAI_API_KEY", "")
    assert spec.problem(value, repr(value)) is not None  # the flag's own check refuses it (what the job checks)
    shown = f"{value:g}" if isinstance(value, float) and math.isfinite(value) else str(value)
    argv = [*command.name.split(), *required_argv(command), spec.flag, shown]
    if spec.meta["positional"]:
        pytest.skip("a positional number")  # none today
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2, err
    assert len(err.splitlines()) == 1 and f"argument {spec.flag}" in err, err


def test_every_bound_has_a_refused_value():
    """A bounded flag for which the test finds no refused value would pass the test above unchecked."""
    assert all(out_of_range(s) for c, s in NUMERIC if s.bounded)


@pytest.mark.parametrize("argv, needle", [
    (["sft", "demos.jsonl", "--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    (["train", "titles", "--seed", "-1"], "argument --seed: must be an integer >= 0, got '-1'"),
    (["train", "titles", "--seeds", "0,-1"], "argument --seeds"),
    (["train", "titles", "--judge-margin", "-0.1"], "argument --judge-margin: must be a finite number in [0, 0.5)"),
    (["judge", "eval", "--labels", "titles", "--margin", "0.5"], "argument --margin: must be a finite number in [0, 0.5)"),
])
def test_the_values_the_review_found(argv, needle, capsys, monkeypatch):
    import groupwise.runtime.loading

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(groupwise.runtime.loading, "load_base_model", no_load)
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and needle in err, err
