"""What `gw.fit` does with its arguments before the run: checks them (all problems at once, one
ConfigError), and lets `score_group` prepare itself (`before_training`: `gw.JudgeSelection` picks its
judge there, or raises `JudgeSelectionError`, before any rollout is paid for); and how the user's
functions are called (sync or async; `validate` with or without the scenario)."""

from __future__ import annotations

import inspect
from typing import Any

from groupwise.config import LoopConfig
from groupwise.errors import ConfigError

__all__ = ["before_training", "check_fit_args", "maybe_await", "takes_scenario"]


def check_fit_args(rollout, train_scenarios, val_scenarios, test_scenarios, score_group, validate, baselines,
                   config) -> None:
    p: list[str] = []
    if not callable(rollout):
        p.append(f"rollout={rollout!r} must be an async function rollout(model, scenario) -> Trajectory")
    if not train_scenarios:
        p.append("train_scenarios is empty; the loop needs scenarios to train on")
    if score_group is not None and not callable(score_group):
        p.append(f"score_group={score_group!r} must be a function group -> group | None (e.g. a RULER call) or None")
    if validate is not None and not callable(validate):
        p.append(f"validate={validate!r} must be a function (trajectory, scenario) -> float or None")
    if validate is not None and not val_scenarios:
        p.append("validate is given but val_scenarios is empty; pass the validation split")
    if baselines and not val_scenarios:
        p.append("baselines are scored on the validation split; pass val_scenarios")
    if test_scenarios and not val_scenarios:
        p.append("test_scenarios evaluate the best checkpoint by validation; pass val_scenarios too")
    if not isinstance(config, LoopConfig):
        p.append(f"config={config!r} must be a LoopConfig")
    if p:
        raise ConfigError(p, what="fit() arguments")


def takes_scenario(validate: Any) -> bool:
    """Whether `validate` takes (trajectory, scenario) rather than (trajectory) alone."""
    try:
        params = [p for p in inspect.signature(validate).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return True
    return len(params) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


async def maybe_await(value: Any) -> Any:
    """`value`, awaited when a user's function returned an awaitable (sync and async both work)."""
    return await value if inspect.isawaitable(value) else value


async def before_training(score_group: Any) -> None:
    """Run `score_group`'s ``before_training()`` hook, if it has one (sync or async)."""
    if callable(prepare := getattr(score_group, "before_training", None)):
        await maybe_await(prepare())
