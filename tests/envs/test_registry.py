"""The registry: every env is complete, its splits are disjoint and seed-independent, and importing
the envs pulls in no torch (the client side stays light)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from groupwise.envs import ENVS, get_env


def _key(s):
    """What identifies a scenario's episode: the question, the text, or the game seed."""
    for attr in ("question_id", "text_id", "seed"):
        if hasattr(s, attr):
            return getattr(s, attr)
    raise AssertionError(f"scenario {s!r} has no identifying field")


def test_registry_names_and_fields():
    assert set(ENVS) == {"2048", "tictactoe", "tictactoe-minimax", "math", "oneword", "email", "titles"}
    for name, spec in ENVS.items():
        assert spec.name == name and spec.reward in ("verifiable", "judge", "hybrid")
        assert (spec.rubric is not None) == (spec.reward != "verifiable")
        assert (spec.val_metric is None) == (spec.reward == "judge")
    with pytest.raises(KeyError, match="the built-in ones are"):
        get_env("chess")


@pytest.mark.parametrize("name", sorted(ENVS))
def test_splits_disjoint_and_seed_independent(name):
    spec = ENVS[name]
    train, val, test = spec.scenarios(0)
    _, val1, test1 = spec.scenarios(1)
    assert train and val and test
    assert [_key(s) for s in val] == [_key(s) for s in val1] and [_key(s) for s in test] == [_key(s) for s in test1]
    assert not {_key(s) for s in train} & {_key(s) for s in val + test}
    assert all(s.temperature == 1.0 for s in train)


def test_importing_envs_does_not_import_torch():
    code = "import sys, groupwise.envs; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_hub_env_is_named_by_its_prefix_and_trains_on_the_hub_preset():
    # `groupwise train verifiers:<module>`: the name passes the job's check and takes the hub preset; the
    # test venv has no verifiers (tests/envs/test_verifiers_hub.py runs it in its own env), so loading one
    # says which extra to install.
    from groupwise.errors import MissingDependencyError
    from groupwise.errors import ConfigError
    from groupwise.jobs.train import HUB_PRESET, TrainJob

    for name in ("verifiers:", "chess"):  # no module named, no such env: the message names the hub form
        with pytest.raises(ConfigError, match="or verifiers:<module>"):
            TrainJob(name)
    job = TrainJob("verifiers:my_env", steps=3)
    assert job.preset() == dataclasses.replace(HUB_PRESET, steps=3) and job.project_of() == "verifiers-my_env"
    try:
        import verifiers  # noqa: F401
    except ImportError:
        with pytest.raises(MissingDependencyError, match=r"groupwise\[verifiers\]"):
            get_env("verifiers:my_env")
