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


def test_replacing_arts_masking_helpers_is_refused_naming_what_to_do():
    """ART's LocalBackend looks its tokenizing helpers up in art.local.backend, so programs replace them
    there to change which tokens are trained; groupwise's trainer never calls them: the assignment fails,
    naming groupwise's way (and leaves the module as it was)."""
    import groupwise.local.backend as backend_module
    from groupwise.hooks import ArtHookError

    def keep_everything(*args, **kwargs):
        raise AssertionError("never called")

    with pytest.raises(ArtHookError, match=r"art\.local\.backend\.tokenize_sft_batch.*assistant_turns='last'"):
        backend_module.tokenize_sft_batch = keep_everything
    with pytest.raises(ArtHookError, match=r"tokenize_trajectory_groups.*message dict instead of its Choice"):
        setattr(backend_module, "tokenize_trajectory_groups", keep_everything)
    with pytest.raises(AttributeError):  # an AttributeError too: a program's `except AttributeError` still runs
        backend_module.packed_tensors_from_tokenized_results = keep_everything
    assert not hasattr(backend_module, "tokenize_sft_batch")
    backend_module.my_own_setting = 3  # a program's own attribute is its business
    assert backend_module.my_own_setting == 3
    del backend_module.my_own_setting


async def test_replacing_an_sft_helper_groupwise_calls_through_its_module_takes_effect(tmp_path, monkeypatch):
    """art.utils.sft.train_sft_from_file calls create_lr_schedule and iterate_file through the module, here
    as in ART: a program's schedule is the one the step trains with."""
    import json

    import groupwise.utils.sft as sft

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                     {"role": "assistant", "content": f"a{i}"}]}) + "\n"
                            for i in range(4)))
    steps = []

    class Recorder:  # the seam: the model's train_sft receives what the file and schedule made
        async def train_sft(self, trajectories, config, **kwargs):
            steps.append((len(list(trajectories)), list(config.learning_rate)))

    original = sft.create_lr_schedule
    try:
        sft.create_lr_schedule = lambda total, peak, *args, **kwargs: [peak / 10] * total
        await sft.train_sft_from_file(Recorder(), str(rows), batch_size=2, peak_lr=1e-3)
    finally:
        sft.create_lr_schedule = original
    assert steps == [(4, [1e-4, 1e-4])]
    # a function groupwise does not call through the module: set, and said once
    replaced = sft.resolve_sft_batch_size
    with pytest.warns(gw.ArtCompatWarning, match="resolve_sft_batch_size was replaced"):
        sft.resolve_sft_batch_size = lambda **kwargs: 7
    assert sft.resolve_sft_batch_size() == 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sft.resolve_sft_batch_size = replaced


def test_arts_remote_backend_client_says_what_to_use_instead():
    """ART 0.2-0.4's art.API / art.Backend(base_url) talk to a remote ART server: here a clear error,
    not Python's "Backend() takes no arguments"."""
    for cls in (gw.Backend, gw.API):
        with pytest.raises(gw.errors.ArgumentTypeError, match=r"remote ART server.*LocalBackend\(\)"):
            cls(base_url="http://cluster:7999")
        with pytest.raises(TypeError, match="LocalBackend"):
            cls("http://cluster:7999")
    from groupwise.skypilot import SkyPilotBackend

    with pytest.raises(gw.ConfigError, match="URL of ART's remote ART server.*drop base_url"):
        SkyPilotBackend(base_url="http://cluster:7999")
