"""One owner per setting: a step's settings are resolved by what each caller SET, in one place.

`TrainConfig` records the fields its caller set (`model_fields_set`, ART's pydantic name), and
`groupwise.core.compat.resolve_train_config` layers them: groupwise's defaults, then the model's own settings
(ART's `_internal_config`), then what the step sets through any spelling (the config's fields, ART's
options, `LoopConfig.learning_rate`). A value equal to the default is still set; two places setting one
field to different values is a ConfigError naming both.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import groupwise as gw
from groupwise.core.compat import is_resolved, resolve_train_config
from groupwise.config import UPDATE_SETTINGS, UpdateSettings

# settings with values other than their defaults, to set or leave
CHOICES = {"learning_rate": 3e-4, "max_grad_norm": 0.5, "weight_decay": 0.01, "seed": 7, "max_seq_len": 512,
           "epsilon": 0.1, "scale_rewards": False, "gradient_checkpointing": True}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(gw.TrainConfig)}


def test_a_loop_rate_and_a_train_config_rate_that_differ_are_refused_even_at_the_default():
    # the train config's 1e-5 is TrainConfig's default, but its caller set it: the loop's 1e-3 may not win
    with pytest.raises(gw.ConfigError, match=r"learning_rate=0.001 and train_config.learning_rate=1e-05 disagree"):
        gw.LoopConfig(learning_rate=1e-3, train_config=gw.TrainConfig(learning_rate=1e-5))
    config = gw.LoopConfig(learning_rate=1e-3, train_config=gw.TrainConfig(seed=3))
    assert (config.step_config().learning_rate, config.step_config().seed) == (1e-3, 3)
    later = gw.LoopConfig(learning_rate=1e-3, train_config=gw.TrainConfig(seed=3))
    later.train_config.learning_rate = 1e-5  # assigned after construction: set too
    with pytest.raises(gw.ConfigError, match="disagree"):
        later.step_config()


def test_a_models_settings_fill_only_what_the_step_does_not_set():
    model = {"max_grad_norm": 0.5, "seed": 9}  # TrainableModel(_internal_config={"trainer_args": ...}).train_defaults()
    explicit = resolve_train_config(gw.TrainConfig(max_grad_norm=1.0), {}, where="t", model_settings=model)
    assert (explicit.max_grad_norm, explicit.seed) == (1.0, 9)  # 1.0 is the default, and it was set
    assert resolve_train_config(gw.TrainConfig(), {}, where="t", model_settings=model).max_grad_norm == 0.5
    art_model = gw.TrainableModel(name="m", project="p", base_path="/tmp/unused-groupwise-store",
                                  _internal_config={"trainer_args": {"max_grad_norm": 0.25}})
    assert art_model.train_defaults() == {"max_grad_norm": 0.25}


@pytest.mark.parametrize(("config", "options", "named"), [
    (gw.TrainConfig(learning_rate=1e-5), {"learning_rate": 2e-5}, r"config.learning_rate=1e-05 and learning_rate=2e-05"),
    (None, {"beta": 0.1, "kl_penalty_coef": 0.2}, r"beta=0.1 and kl_penalty_coef=0.2"),
    (gw.TrainConfig(loss="ppo"), {"loss_fn": "cispo"}, r"config.loss='ppo' and loss_fn='cispo'"),
    ({"learning_rate": 1e-4}, {"learning_rate": 2e-4}, r"config.learning_rate=0.0001 and learning_rate=0.0002"),
])
def test_two_spellings_setting_one_field_differently_are_refused_naming_both(config, options, named):
    with pytest.raises(gw.ConfigError, match=named):
        resolve_train_config(config, options, where="t", model_settings={"learning_rate": 5e-6})


def test_the_same_value_through_two_spellings_is_one_setting():
    config = resolve_train_config(gw.TrainConfig(kl_coef=0.1), {"beta": 0.1, "learning_rate": 1e-5}, where="t")
    assert (config.kl_coef, config.learning_rate) == (0.1, 1e-5)


def test_a_resolved_config_is_not_resolved_again_until_a_field_changes():
    config = resolve_train_config(gw.TrainConfig(learning_rate=2e-5), {}, where="t")
    assert is_resolved(config) and config.model_fields_set == {"learning_rate"}
    assert not is_resolved(gw.TrainConfig(learning_rate=2e-5))
    config.seed = 4
    assert not is_resolved(config) and config.model_fields_set == {"learning_rate", "seed"}


def test_the_grpo_and_sft_configs_share_their_update_settings():
    shared = {f.name for f in dataclasses.fields(UpdateSettings)}
    assert shared == set(UPDATE_SETTINGS) and len(shared) == 8
    assert shared <= {f.name for f in dataclasses.fields(gw.TrainConfig)}
    assert shared <= {f.name for f in dataclasses.fields(gw.TrainSFTConfig)}
    sft = gw.TrainSFTConfig(learning_rate=[1e-4, 2e-4], max_grad_norm=0.3, seed=5, gradient_checkpointing=True)
    update = sft.update_config(2e-4)
    assert {n: getattr(update, n) for n in shared} == {**{n: getattr(sft, n) for n in shared}, "learning_rate": 2e-4}
    with pytest.raises(gw.ConfigError, match="max_grad_norm"):  # the shared checks run for both
        gw.TrainSFTConfig(max_grad_norm=-1.0)


@settings(max_examples=50, deadline=None)
@given(step=st.sets(st.sampled_from(sorted(CHOICES))), model=st.sets(st.sampled_from(sorted(CHOICES))),
       at_default=st.sets(st.sampled_from(sorted(CHOICES))))
def test_resolution_is_by_what_was_set_never_by_comparing_with_defaults(step, model, at_default):
    # the step sets `step` (those in `at_default` to the default's value), the model sets `model` (to
    # other values); every field ends at the step's value, else the model's, else the default
    step_values = {n: DEFAULTS[n] if n in at_default else CHOICES[n] for n in step}
    model_values = {n: ("other", CHOICES[n]) for n in model}
    model_values = {n: (0.125 if isinstance(v, float) else 11 if isinstance(v, int) and not isinstance(v, bool)
                        else not v if isinstance(v, bool) else v) for n, (_, v) in model_values.items()}
    config = resolve_train_config(gw.TrainConfig(**step_values), {}, where="property", model_settings=model_values)
    for name in CHOICES:
        expected = step_values.get(name, model_values.get(name, DEFAULTS[name]))
        assert getattr(config, name) == expected, name
    assert config.model_fields_set == set(step_values) | set(model_values)
