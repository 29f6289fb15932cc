"""Every numeric setting of every config is a finite number in its range, checked when the config is
built, and every problem is listed in one ConfigError naming the field, its value and what is allowed.

nan compares False with every bound, so a check written as ``value < 0`` lets it through; inf passes
``value > 0``. An inf learning rate used to reach the first step and write a NaN adapter.
"""

from __future__ import annotations

import math

import pytest

import groupwise as gw
from groupwise.config import DetectorConfig, LoopConfig, LoraConfig, TrainConfig, TrainSFTConfig
from groupwise.errors import ConfigError, GroupwiseError
from groupwise.judge.config import JudgeConfig

NAN, INF = math.nan, math.inf


def _problems(cls, **kwargs) -> list[str]:
    with pytest.raises(ConfigError) as err:
        cls(**kwargs)
    assert isinstance(err.value, GroupwiseError)
    return err.value.problems


@pytest.mark.parametrize("value", [INF, -INF, NAN])
def test_a_non_finite_learning_rate_is_refused_up_front(value):
    for cls in (TrainConfig, LoopConfig, TrainSFTConfig):
        (problem,) = _problems(cls, learning_rate=value)
        assert problem.startswith(f"learning_rate={value!r} must be a finite")
        assert "> 0" in problem


def test_all_problems_of_a_train_config_come_at_once_with_field_value_and_range():
    problems = _problems(TrainConfig, learning_rate=INF, epsilon=NAN, epsilon_high=INF, kl_coef=NAN,
                         max_grad_norm=INF, weight_decay=NAN, micro_batch_tokens=4096.5, max_seq_len=INF,
                         logprob_chunk_size=0, seed=-1)
    assert problems == [
        "learning_rate=inf must be a finite number > 0",
        "epsilon=nan must be a finite number > 0",
        "epsilon_high=inf must be a finite number > 0",
        "kl_coef=nan must be a finite number >= 0",
        "max_grad_norm=inf must be a finite number >= 0",
        "weight_decay=nan must be a finite number >= 0",
        "micro_batch_tokens=4096.5 must be an integer > 0",
        "max_seq_len=inf must be an integer > 0",
        "logprob_chunk_size=0 must be an integer > 0",
        "seed=-1 must be an integer >= 0",
    ]


def test_loop_config_refuses_non_finite_thresholds():
    problems = _problems(LoopConfig, learning_rate=NAN, min_delta=INF, target=NAN, baseline_margin=INF,
                         confidence=NAN, max_exceptions=INF, resample_no_signal=1.5, max_steps=2.0,
                         rollout_timeout_s=NAN)
    assert problems == [
        "max_steps=2.0 must be an integer >= 0",
        "learning_rate=nan must be a finite number > 0",
        "target=nan must be a finite number",
        "confidence=nan must be a finite number in (0, 1)",
        "min_delta=inf must be a finite number >= 0",
        "baseline_margin=inf must be a finite number >= 0",
        "resample_no_signal=1.5 must be an integer >= 0",
        "rollout_timeout_s=nan must be a finite number > 0",
        "max_exceptions=inf must be a count (an integer >= 0) or a fraction in (0, 1)",
    ]
    # NaN max_exceptions used to pass (every comparison with nan is False)
    assert _problems(LoopConfig, max_exceptions=NAN) == [
        "max_exceptions=nan must be a count (an integer >= 0) or a fraction in (0, 1)"]
    # the valid edges still pass
    LoopConfig(max_exceptions=0.5, target=1.0, max_steps=0, baseline_margin=None)


def test_lora_sft_detector_and_judge_configs_refuse_non_finite_and_non_numbers():
    assert _problems(LoraConfig, rank=True, alpha="16", dropout=1.0, seed=NAN) == [
        "rank=True must be an integer > 0",
        "alpha='16' must be a finite number > 0",
        "dropout=1.0 must be a finite number in [0, 1)",
        "seed=nan must be an integer >= 0",
    ]
    assert _problems(TrainSFTConfig, learning_rate=[1e-5, INF, NAN], max_grad_norm=NAN) == [
        "learning_rate[1]=inf must be a finite rate >= 0",
        "learning_rate[2]=nan must be a finite rate >= 0",
        "max_grad_norm=nan must be a finite number >= 0",
    ]
    # a schedule's batch may be 0 (ART's linear and cosine decays end there; ART's chunked SFT may give
    # the last chunk that batch alone); a single rate may not
    assert TrainSFTConfig(learning_rate=[2e-4, 1e-4, 0.0]).learning_rate[-1] == 0.0
    assert TrainSFTConfig(learning_rate=[0.0]).learning_rate == [0.0]
    assert _problems(TrainSFTConfig, learning_rate=0.0) == ["learning_rate=0.0 must be a finite rate > 0 or a list of them"]
    assert _problems(DetectorConfig, val_drop=NAN, perfect_reward=INF)[:2] == [
        "val_drop=nan must be a finite number >= 0",
        "perfect_reward=inf must be a finite number",
    ]
    assert _problems(JudgeConfig, timeout_s=INF, backoff_s=NAN, temperature=NAN, passes=2.5,
                     prices={"m": (1.0, INF)}) == [
        "passes=2.5 must be an integer > 0",
        "backoff_s=nan must be a finite number >= 0",
        "timeout_s=inf must be a finite number > 0",
        "temperature=nan must be a finite number >= 0",
        "prices['m']=(1.0, inf) must be (usd_per_M_prompt, usd_per_M_completion), both finite and >= 0",
    ]


def test_backend_arguments_are_checked_when_the_backend_is_built():
    with pytest.raises(ConfigError) as err:
        gw.LocalBackend(max_batch_size=0, served_steps=NAN, collective_timeout_s=INF,
                        engine_kwargs={"max_seq_len": INF, "prefix_cache_tokens": -1, "cuda_graphs": False})
    assert err.value.problems == [
        "max_batch_size=0 must be an integer > 0",
        "served_steps=nan must be an integer > 0",
        "collective_timeout_s=inf must be a finite number > 0",
        "engine_kwargs['max_seq_len']=inf must be an integer >= 0",
        "engine_kwargs['prefix_cache_tokens']=-1 must be an integer >= 0",
    ]


def test_the_backends_share_one_definition_of_their_options():
    import dataclasses
    import inspect

    from groupwise.backend.options import BackendOptions

    # every BackendOptions field is a keyword of both backends, with the field's default (None: a factory's)
    fields = {f.name: (None if f.default is dataclasses.MISSING else f.default) for f in dataclasses.fields(BackendOptions)}
    assert {"max_batch_size", "served_steps", "best_checkpoint_metric", "collective_timeout_s"} <= set(fields)
    for cls in (gw.LocalBackend, gw.RayBackend):
        params = inspect.signature(cls).parameters
        assert {name: params[name].default for name in fields} == fields, cls
    # keywords and options= give the same options; the driver reads them from `backend.options`
    lora = gw.LoraConfig(rank=4)
    by_keywords = gw.LocalBackend(max_batch_size=8, dtype="float32", lora=lora, engine_kwargs={"batch_invariant": True})
    whole = gw.LocalBackend(options=BackendOptions(max_batch_size=8, dtype="float32", lora=lora,
                                                   engine_kwargs={"batch_invariant": True}))
    assert by_keywords.options == whole.options and by_keywords.options.lora.rank == 4
    assert gw.LocalBackend(lora=None, engine_kwargs=None).options == BackendOptions()
    ray = gw.RayBackend(num_workers=2, served_steps=3)  # nothing starts (nor imports Ray) before register
    assert (ray.options.served_steps, ray.world_size) == (3, 2)


def test_backend_options_errors_list_every_problem_and_say_what_to_do():
    import dataclasses

    from groupwise.backend.options import BackendOptions

    with pytest.raises(ConfigError) as err:
        gw.LocalBackend(max_batch_sise=8, device="cpu", devices=2)
    names = [f.name for f in dataclasses.fields(BackendOptions)]  # the message lists every option there is
    assert {"dtype", "max_batch_size", "served_steps", "collective_timeout_s"} <= set(names)
    assert err.value.problems == [
        "device='cpu' and devices=2: give one (devices for several)",
        f"unknown argument(s) max_batch_sise; the backend options are {', '.join(names)}",
    ]
    with pytest.raises(ConfigError, match="give the options one way"):
        gw.LocalBackend(options=BackendOptions(), max_batch_size=8)
    with pytest.raises(ConfigError) as err:
        gw.RayBackend(num_workers=0, ready_timeout_s=NAN, lora={"rank": 4})
    assert err.value.problems == [
        "lora={'rank': 4} must be a gw.LoraConfig (or None for the default)",
        "ready_timeout_s=nan must be a finite number > 0",
        "num_workers=0 must be an int >= 1",
    ]
    options = BackendOptions()
    options.served_steps = 0  # assigned after construction: checked again when a backend takes it
    with pytest.raises(ConfigError, match="served_steps=0 must be an integer > 0"):
        gw.LocalBackend(options=options)


def test_defaults_are_valid():
    for cls in (TrainConfig, LoopConfig, LoraConfig, TrainSFTConfig, DetectorConfig, JudgeConfig):
        cls()


HOSTILE = [NAN, INF, -1, 0, 10**30, "", "x", None, [], {}, True, 1e-300, 2**63, (1, 2)]


@pytest.mark.parametrize("cls", [TrainConfig, LoopConfig, LoraConfig, TrainSFTConfig, DetectorConfig, JudgeConfig,
                                 gw.BackendOptions])
def test_any_field_set_to_any_value_is_accepted_or_a_config_error(cls):
    """Field by field, each hostile value (wrong types included): the config is built, or it raises a
    ConfigError naming the field; never a bare TypeError from inside (engine_kwargs=5 and prices=3.0
    once raised one)."""
    import dataclasses

    for field in dataclasses.fields(cls):
        for value in HOSTILE:
            try:
                cls(**{field.name: value})
            except ConfigError as exc:
                assert field.name in str(exc), (field.name, value, str(exc))
