"""Stopping rules: pure functions over the history (the seed's "knowing when you're done").

Each rule returns a `StopDecision` whose `reason` is the sentence shown in the summary, the history and
the report. The curve a rule watches is the *primary curve*: the validation metric (``val/<metric>``)
where the run has validation, else the mean train reward (pure-RULER runs, seed: "avg reward plateaus
10+ steps"). Rules, in the order `check_stopping` applies them:

- max steps: ``step >= max_steps``;
- target: the latest primary value reaches ``target``;
- baseline: the latest validation value beats the best baseline by ``baseline_margin``;
- plateau: no improvement larger than ``min_delta`` during the last ``patience`` steps.

``higher_is_better=False`` flips every comparison (for error rates, losses).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.loop.series import Row, events, series, value

if TYPE_CHECKING:
    from groupwise.config import LoopConfig


@dataclass(frozen=True)
class StopDecision:
    """Whether to stop, by which rule, and why (a sentence a user can act on)."""

    stop: bool
    rule: str = ""  # "max_steps", "target", "baseline", "plateau", "policy", "data_exhausted", "" (continue)
    reason: str = ""
    step: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.stop


def primary_curve(history: list[Row], metric: str, *, up_to: int | None = None) -> tuple[str, list[tuple[int, float]]]:
    """(name, points) of the curve stopping watches: val/<metric> if logged, else train/reward."""
    val = series(history, "val", metric, up_to=up_to)
    if val:
        return f"val/{metric}", val
    return "train/reward", series(history, "train", "reward", up_to=up_to)


def _better(a: float, b: float, higher_is_better: bool, delta: float = 0.0) -> bool:
    """a improves on b by more than delta."""
    return a > b + delta if higher_is_better else a < b - delta


def last_improvement(points: list[tuple[int, float]], min_delta: float, higher_is_better: bool = True) -> tuple[int, float]:
    """(step, value) of the last point that improved on every earlier one by more than min_delta."""
    best_step, best = points[0]
    for s, v in points[1:]:
        if _better(v, best, higher_is_better, min_delta):
            best_step, best = s, v
    return best_step, best


def plateau(
    history: list[Row], *, step: int, patience: int, min_delta: float = 0.0,
    metric: str = "accuracy", higher_is_better: bool = True,
) -> StopDecision:
    """Stop when the primary curve has not improved by more than min_delta for `patience` steps."""
    name, points = primary_curve(history, metric, up_to=step)
    if len(points) < 2:
        return StopDecision(False, step=step)
    best_step, best = last_improvement(points, min_delta, higher_is_better)
    waited = step - best_step
    if waited < patience:
        return StopDecision(False, step=step)
    return StopDecision(
        True, "plateau",
        f"{name} plateaued: no improvement larger than {min_delta:g} for {waited} steps "
        f"(best {best:.4g} at step {best_step}; patience {patience})",
        step, {"curve": name, "best_step": best_step, "best": best, "latest": points[-1][1], "waited": waited},
    )


def target_reached(
    history: list[Row], *, step: int, target: float | None, metric: str = "accuracy", higher_is_better: bool = True,
) -> StopDecision:
    """Stop when the latest value of the primary curve reaches `target` (None disables)."""
    if target is None:
        return StopDecision(False, step=step)
    name, points = primary_curve(history, metric, up_to=step)
    if not points:
        return StopDecision(False, step=step)
    at, latest = points[-1]
    reached = latest >= target if higher_is_better else latest <= target
    if not reached:
        return StopDecision(False, step=step)
    return StopDecision(True, "target", f"{name} reached the target: {latest:.4g} at step {at} (target {target:g})",
                        step, {"curve": name, "value": latest, "target": target, "at_step": at})


def baseline_values(history: list[Row], metric: str) -> dict[str, float]:
    """{baseline name: its validation metric} from the history's baseline rows."""
    out: dict[str, float] = {}
    for row in events(history, "baseline"):
        v = value(row, "val", metric)
        if v is not None:
            out[str(row.get("name"))] = v
    return out


def baseline_beaten(
    history: list[Row], *, step: int, margin: float | None, metric: str = "accuracy",
    higher_is_better: bool = True, baselines: dict[str, float] | None = None,
) -> StopDecision:
    """Stop when the latest validation value beats the best baseline by `margin` (None disables).

    `baselines` defaults to the history's baseline rows (the untrained base at step 0 among them).
    """
    if margin is None:
        return StopDecision(False, step=step)
    base = baseline_values(history, metric) if baselines is None else dict(baselines)
    points = series(history, "val", metric, up_to=step)
    if not base or not points:
        return StopDecision(False, step=step)
    pick = max if higher_is_better else min
    best_name = pick(base, key=lambda k: base[k])
    at, latest = points[-1]
    # Inclusive, with a hair of tolerance so 0.96 beats 0.90 by 0.06 despite float rounding.
    if not _better(latest, base[best_name], higher_is_better, margin - 1e-12):
        return StopDecision(False, step=step)
    return StopDecision(
        True, "baseline",
        f"val/{metric} {latest:.4g} at step {at} beats the best baseline {best_name!r} ({base[best_name]:.4g}) "
        f"by at least {margin:g}",
        step, {"value": latest, "baseline": best_name, "baseline_value": base[best_name], "margin": margin},
    )


def max_steps_reached(*, step: int, max_steps: int | None) -> StopDecision:
    """Stop once `max_steps` training steps are complete (None disables)."""
    if max_steps is None or step < max_steps:
        return StopDecision(False, step=step)
    return StopDecision(True, "max_steps", f"reached max_steps={max_steps} (step {step})", step,
                        {"max_steps": max_steps})


def check_stopping(history: list[Row], step: int, config: "LoopConfig") -> StopDecision:
    """The first rule that says stop (max steps, target, baseline, plateau), or a continue decision."""
    hib = config.higher_is_better
    for decision in (
        max_steps_reached(step=step, max_steps=config.max_steps),
        target_reached(history, step=step, target=config.target, metric=config.metric, higher_is_better=hib),
        baseline_beaten(history, step=step, margin=config.baseline_margin, metric=config.metric, higher_is_better=hib),
        plateau(history, step=step, patience=config.patience, min_delta=config.min_delta,
                metric=config.metric, higher_is_better=hib),
    ):
        if decision:
            return decision
    return StopDecision(False, step=step)
