"""ART's behaviour at the edges of its API, where programs depend on it: metadata values of any kind
(ART 0.5.23), and the module-level functions of ART that programs replace (hooks)."""

from __future__ import annotations

import warnings

import pytest

import groupwise as gw
from groupwise.errors import GroupwiseWarning


class Opaque:
    """A value JSON cannot hold (a program's own object)."""

    def __repr__(self) -> str:
        return "Opaque(42)"


async def test_metadata_takes_any_value_and_stores_json_losslessly(tmp_path):
    """ART 0.5.23's metadata takes any value: nested dicts and lists (a scenario, a config) come back
    equal; a value JSON cannot hold is stored as its repr(), said once per type."""
    nested = {"scenario": {"id": 7, "tags": ["a", "b"], "limits": {"turns": 3, "tools": None}}, "score": 0.5}
    t = gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=1.0, metadata=dict(nested))
    t.metadata["set_later"] = [{"step": 1}, [2, 3]]  # a rollout fills it in place
    t.metadata["opaque"] = Opaque()
    other = gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=0.0,
                          metadata={"opaque_too": Opaque(), "pair": (1, 2)})
    group = gw.TrajectoryGroup([t, other], metadata={"config": {"lr": 1e-5, "layers": [1, 2]}})
    model = gw.Model(name="m", project="p", base_path=str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await model.log([group], split="val", step=0)
    said = [str(w.message) for w in caught if issubclass(w.category, GroupwiseWarning)]
    assert len(said) == 1 and "Opaque" in said[0] and "repr()" in said[0]  # one per type, not per value
    (back,) = model.store.load_trajectories("val", 0)
    assert back.metadata == {"config": {"lr": 1e-5, "layers": [1, 2]}}
    first, second = back.trajectories
    assert {k: first.metadata[k] for k in nested} == nested
    assert first.metadata["set_later"] == [{"step": 1}, [2, 3]] and first.metadata["opaque"] == "Opaque(42)"
    assert second.metadata == {"opaque_too": "Opaque(42)", "pair": [1, 2]}  # JSON has lists, not tuples
    assert isinstance(t.metadata["opaque"], Opaque)  # the program's own object is left as it was
