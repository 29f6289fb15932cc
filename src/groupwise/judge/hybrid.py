"""Hybrid rewards: combine a verifiable result (from code) with the judge's quality score.

Code says whether the answer is right, the judge says how good the trajectory is. Two combinations
cover most uses:

- `gate(correct, quality)`: correctness gates quality. A wrong answer gets `fail_value`; a right
  one gets `pass_floor + (1 - pass_floor) * quality`. With pass_floor > fail_value every correct
  trajectory outranks every wrong one, so the judge can only reorder within each class.
- `weighted(verifiable, quality, weight)`: `weight * verifiable + (1 - weight) * quality`.

`apply_hybrid(judged_group, combine)` applies one of them to a group returned by
`ruler_score_group`, which has kept each trajectory's code reward in
``metrics["independent_reward"]`` and the judge's score in ``metrics["ruler_score"]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from groupwise.errors import ConfigError, UnknownKeyError
from groupwise.core.trajectory import TrajectoryGroup


def _unit(name: str, value: float) -> float:
    v = float(value)
    if not math.isfinite(v) or not 0.0 <= v <= 1.0:
        raise ConfigError(f"{name}={value!r} must be a finite number in [0, 1] (a bool counts as 0 or 1)",
                          what="hybrid reward")
    return v


def gate(correct: bool | float, quality: float, *, pass_floor: float = 0.0, fail_value: float = 0.0) -> float:
    """`fail_value` if wrong; `pass_floor + (1 - pass_floor) * quality` if right.

    `correct` may be a fraction in [0, 1] (e.g. 3 of 4 unit tests): the two outcomes are mixed by it.
    With the defaults this is exactly correct * quality.
    """
    c, q = _unit("correct", correct), _unit("quality", quality)
    _unit("pass_floor", pass_floor)
    return c * (pass_floor + (1.0 - pass_floor) * q) + (1.0 - c) * fail_value


def weighted(verifiable: float, quality: float, *, weight: float = 0.5) -> float:
    """`weight * verifiable + (1 - weight) * quality`."""
    w = _unit("weight", weight)
    return w * float(verifiable) + (1.0 - w) * _unit("quality", quality)


def weighted_sum(components: Mapping[str, float], weights: Mapping[str, float]) -> float:
    """Sum of weights[k] * components[k] over the weights' keys, divided by the sum of the weights."""
    missing = sorted(set(weights) - set(components))
    if missing:
        raise UnknownKeyError(f"weighted_sum: no value for components {missing}; got {sorted(components)}")
    total = sum(weights.values())
    if total <= 0:
        raise ConfigError(f"the weights sum to {total}; they must sum to > 0", what="weighted_sum weights")
    return sum(w * float(components[k]) for k, w in weights.items()) / total


def apply_hybrid(
    judged: TrajectoryGroup,
    combine: Callable[..., float] = gate,
    *,
    verifiable_key: str = "independent_reward",
    judge_key: str = "ruler_score",
    **combine_kwargs: Any,
) -> TrajectoryGroup:
    """A copy of a judged group with reward = combine(metrics[verifiable_key], metrics[judge_key]).

    The combined reward is also kept in ``metrics["hybrid_reward"]``; the inputs stay in metrics.
    """
    out = judged.model_copy(deep=True)
    for i, t in enumerate(out.trajectories):
        missing = [k for k in (verifiable_key, judge_key) if k not in t.metrics]
        if missing:
            raise UnknownKeyError(
                f"apply_hybrid: trajectory {i} has no metrics {missing}. Judge the group with ruler_score_group "
                "first (it stores the code reward as 'independent_reward' and the score as 'ruler_score'), "
                "or name other keys with verifiable_key=/judge_key=."
            )
        reward = float(combine(t.metrics[verifiable_key], t.metrics[judge_key], **combine_kwargs))
        t.metrics["hybrid_reward"] = reward
        t.reward = reward
    return out
