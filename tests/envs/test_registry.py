"""The registry: every env is complete, its splits are disjoint and seed-independent, and importing
the envs pulls in no torch (the client side stays light)."""

from __future__ import annotations

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
    assert set(ENVS) == {"2048", "tictactoe", "tictactoe-minimax", "math", "email", "titles"}
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
