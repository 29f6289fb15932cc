"""Baselines: the untrained base (``name@0``) and any `gw.Model` scored once on the validation split.

`fit` scores the same baselines at its start (`fit(..., baselines=[...])`); call `score_baselines` to score
them before (or without) training, with the same code and the same history rows. Each
baseline becomes a history row of split ``baseline`` (``name``, ``kind`` = "base" or "model", the
validation metric with its interval, ``reward``), and a prompted model's trajectories are stored under
``trajectories/baseline-<name>/0000.jsonl``, so `groupwise report` draws them as horizontal lines and
`groupwise inspect` shows what they answered. A baseline already in the history is not scored again
(a resumed run does not pay twice).

A baseline is any object a rollout accepts as its model: a `gw.Model(name=..., inference_base_url=...,
inference_api_key=...)` reaches any OpenAI-compatible endpoint (a hosted model, or `groupwise serve`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from groupwise.config import LoopConfig
from groupwise.loop.stopping import baseline_values


async def score_baselines(
    model: Any,
    rollout: Any,
    val_scenarios: Sequence[Any],
    baselines: Sequence[Any] = (),
    *,
    validate: Any = None,
    config: LoopConfig | None = None,
) -> dict[str, float]:
    """Score ``model@0`` and each of `baselines` on `val_scenarios` (once); return {name: metric}."""
    from groupwise.loop.checks import check_fit_args
    from groupwise.loop.fit import Loop

    config = config if config is not None else LoopConfig()
    val = list(val_scenarios)
    check_fit_args(rollout, [None], val, [], None, validate, list(baselines), config)
    loop = Loop(model, rollout, [], val, [], None, validate, list(baselines), config)
    await loop.ensure_baselines()
    return baseline_values(loop.history, config.metric)
