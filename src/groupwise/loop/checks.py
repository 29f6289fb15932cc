"""The checks of `gw.fit`'s arguments (all problems at once, one ConfigError), and how `validate` is called."""

from __future__ import annotations

import inspect
from typing import Any

from groupwise.config import LoopConfig
from groupwise.errors import ConfigError

__all__ = ["check_fit_args", "takes_scenario"]


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
