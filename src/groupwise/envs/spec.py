"""`EnvSpec`: one environment as the training loop sees it (its contract), apart from the registry in
`groupwise.envs` so the hub adapters (`verifiers_hub`, `openenv_hub`) build specs without importing it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from groupwise.core.trajectory import Trajectory

RewardKind = Literal["verifiable", "judge", "hybrid"]


@dataclass(frozen=True)
class EnvSpec:
    """One environment as the training loop sees it."""

    name: str
    description: str
    rollout: Callable[[Any, Any], Awaitable[Trajectory]]
    # scenarios(seed, **overrides) -> (train, val, test). Val/test do not depend on the seed (the same
    # held-out set for every run); overrides (e.g. max_tokens=8, temperature=0.7) apply to every scenario.
    scenarios: Callable[..., tuple[list[Any], list[Any], list[Any]]]
    # validate(trajectory) -> float, higher is better, averaged over the val split; None for judge-only envs.
    validate: Callable[[Trajectory], float | None]
    val_metric: str | None  # what validate measures, for tables and plots
    reward: RewardKind  # verifiable: rollout sets the reward; judge: RULER sets it; hybrid: both
    rubric: str | None = None  # for the judge (judge and hybrid envs); None means the judge's default
    gate_metric: str | None = None  # hybrid: metric (0/1) a judged reward may be gated by
    # demonstrate(scenario) -> Trajectory: a scripted policy that knows the ground truth, whose
    # trajectories are the demonstrations of a supervised warm start (`groupwise train <env> --sft N`).
    demonstrate: Callable[[Any], Trajectory] | None = None


__all__ = ["EnvSpec", "RewardKind"]
