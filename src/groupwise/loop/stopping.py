"""Stopping rules: pure functions over the history, the loop's "knowing when you're done".

Each rule returns a `StopDecision` whose `reason` is the sentence shown in the summary, the history and
the report. The curve a rule watches is the *primary curve*: the validation metric (``val/<metric>``)
where the run has validation, else the mean train reward (pure-RULER runs: a reward that plateaus for
10+ steps is done). Rules, in the order `check_stopping` applies them:

- max steps: ``step >= max_steps``;
- target: the latest primary value reaches ``target``;
- baseline: the latest validation value beats the best baseline by ``baseline_margin``, and by more than
  the noise of the two measurements;
- plateau: no improvement larger than ``min_delta`` and than the noise during the last ``patience`` steps.

Noise: each validation carries its confidence interval (``groupwise.loop.intervals``); two values differ
only when their gap exceeds the half-widths facing each other, added in quadrature (`significant_gap`).
A curve without intervals (old histories, hand-built ones) compares bare values.
``higher_is_better=False`` flips every comparison (for error rates, losses).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.config import DEFAULT_CONFIDENCE, DEFAULT_VAL_METRIC
from groupwise.core.learning_signal import ZERO_VARIANCE_TOL
from groupwise.loop.intervals import combined_noise
from groupwise.runs.curves import baseline_points
from groupwise.runs.series import Point, Row, events, points

if TYPE_CHECKING:
    from groupwise.config import LoopConfig


@dataclass(frozen=True)
class StopDecision:
    """Whether to stop, by which rule, and why (a sentence a user can act on)."""

    stop: bool
    rule: str = ""  # "max_steps", "target", "baseline", "plateau", "alert:<name>", "converged", "data_exhausted", "" (continue)
    reason: str = ""
    step: int = 0
    evidence: dict[str, Any] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return self.stop


def primary_curve(history: list[Row], metric: str, *, up_to: int | None = None,
                  confidence: float = DEFAULT_CONFIDENCE) -> tuple[str, list[Point]]:
    """(name, points) of the curve stopping watches: val/<metric> if logged, else train/reward."""
    val = points(history, "val", metric, up_to=up_to, confidence=confidence)
    if val:
        return f"val/{metric}", val
    return "train/reward", points(history, "train", "reward", up_to=up_to, confidence=confidence)


def _better(a: float, b: float, higher_is_better: bool, delta: float = 0.0) -> bool:
    """a improves on b by more than delta."""
    return a > b + delta if higher_is_better else a < b - delta


def _as_point(p: Point | tuple[int, float]) -> Point:
    return p if isinstance(p, Point) else Point(int(p[0]), float(p[1]))


def gap_noise(new: Point | tuple[int, float], old: Point | tuple[int, float], higher_is_better: bool = True) -> float:
    """The noise of the change old -> new in the direction of improvement: the half-widths of their
    intervals that face each other (new's lower side and old's upper side when higher is better),
    in quadrature. 0 when neither has an interval."""
    new, old = _as_point(new), _as_point(old)
    if higher_is_better:
        return combined_noise(new.below, old.above)
    return combined_noise(new.above, old.below)


def significant_gap(new: Point | tuple[int, float], old: Point | tuple[int, float], higher_is_better: bool = True,
                    min_delta: float = 0.0) -> bool:
    """new improves on old by more than min_delta and by more than the noise of the two."""
    new, old = _as_point(new), _as_point(old)
    gain = (new.value - old.value) if higher_is_better else (old.value - new.value)
    return gain > min_delta and gain > gap_noise(new, old, higher_is_better)


def last_improvement(curve: list[Point] | list[tuple[int, float]], min_delta: float,
                     higher_is_better: bool = True) -> tuple[int, float]:
    """(step, value) of the last point that improved on the best before it by more than min_delta and
    than the noise of the two (points without intervals: by more than min_delta)."""
    pts = [_as_point(p) for p in curve]
    best = pts[0]
    for p in pts[1:]:
        if significant_gap(p, best, higher_is_better, min_delta):
            best = p
    return best.step, best.value


def plateau(
    history: list[Row], *, step: int, patience: int, min_delta: float = 0.0,
    metric: str = DEFAULT_VAL_METRIC, higher_is_better: bool = True, confidence: float = DEFAULT_CONFIDENCE,
) -> StopDecision:
    """Stop when the primary curve has not improved beyond min_delta and its noise for `patience` steps."""
    name, curve = primary_curve(history, metric, up_to=step, confidence=confidence)
    if len(curve) < 2:
        return StopDecision(False, step=step)
    best_step, best = last_improvement(curve, min_delta, higher_is_better)
    waited = step - best_step
    if waited < patience:
        return StopDecision(False, step=step)
    noisy = any(p.lo is not None for p in curve)
    return StopDecision(
        True, "plateau",
        f"{name} plateaued: no improvement larger than {min_delta:g}"
        f"{' and than its noise' if noisy else ''} for {waited} steps "
        f"(best {best:.4g} at step {best_step}, latest {curve[-1].value:.4g}; patience {patience})",
        step, {"curve": name, "best_step": best_step, "best": best, "latest": curve[-1].value, "waited": waited},
    )


def target_reached(
    history: list[Row], *, step: int, target: float | None, metric: str = DEFAULT_VAL_METRIC, higher_is_better: bool = True,
) -> StopDecision:
    """Stop when the latest value of the primary curve reaches `target` (None disables)."""
    if target is None:
        return StopDecision(False, step=step)
    name, curve = primary_curve(history, metric, up_to=step)
    if not curve:
        return StopDecision(False, step=step)
    at, latest = curve[-1].step, curve[-1].value
    reached = latest >= target if higher_is_better else latest <= target
    if not reached:
        return StopDecision(False, step=step)
    return StopDecision(True, "target", f"{name} reached the target: {latest:.4g} at step {at} (target {target:g})",
                        step, {"curve": name, "value": latest, "target": target, "at_step": at})


def baseline_values(history: list[Row], metric: str) -> dict[str, float]:
    """{baseline name: its validation metric} from the history's baseline rows."""
    return {name: p.value for name, p in baseline_points(events(history, "baseline"), metric).items()}


def baseline_beaten(
    history: list[Row], *, step: int, margin: float | None, metric: str = DEFAULT_VAL_METRIC,
    higher_is_better: bool = True, baselines: dict[str, float] | None = None,
) -> StopDecision:
    """Stop when the latest validation value beats the best baseline by `margin` and by more than the
    noise of the two measurements (None disables).

    `baselines` defaults to the history's baseline rows (the untrained base at step 0 among them).
    """
    if margin is None:
        return StopDecision(False, step=step)
    base = baseline_points(events(history, "baseline"), metric) if baselines is None else {k: Point(0, v) for k, v in baselines.items()}
    curve = points(history, "val", metric, up_to=step)
    if not base or not curve:
        return StopDecision(False, step=step)
    pick = max if higher_is_better else min
    best_name = pick(base, key=lambda k: base[k].value)
    latest, ref = curve[-1], base[best_name]
    # Inclusive, with a hair of tolerance so 0.96 beats 0.90 by 0.06 despite float rounding.
    if not _better(latest.value, ref.value, higher_is_better, margin - 1e-12):
        return StopDecision(False, step=step)
    noise = gap_noise(latest, ref, higher_is_better)
    if abs(latest.value - ref.value) <= noise:
        return StopDecision(False, step=step)
    return StopDecision(
        True, "baseline",
        f"val/{metric} {latest.value:.4g} at step {latest.step} beats the best baseline {best_name!r} "
        f"({ref.value:.4g}) by at least {margin:g}" + (f" and by more than the noise ({noise:.3g})" if noise else ""),
        step, {"value": latest.value, "baseline": best_name, "baseline_value": ref.value, "margin": margin,
               "noise": noise},
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
                metric=config.metric, higher_is_better=hib, confidence=config.confidence),
    ):
        if decision:
            return decision
    return StopDecision(False, step=step)


def reward_range_of(history: list[Row]) -> tuple[float, float] | None:
    """(lowest, highest) mean train reward in the history: where a resumed run's reward range starts
    (the loop widens it with every rollout's own reward); `groupwise.core.learning_signal` reads it to tell
    a tie at the top ('solved') from one below it."""
    means = [p.value for p in points(history, "train", "reward") if math.isfinite(p.value)]
    return (min(means), max(means)) if means else None


def val_at_ceiling(history: list[Row], config: "LoopConfig") -> bool:
    """The latest validation sits at its ceiling: a metric bounded by 1 (its interval's upper end is
    1.0, as accuracies' are) that scored 1.0 on every scenario."""
    if not config.higher_is_better:
        return False
    val = points(history, "val", config.metric, confidence=config.confidence)
    return bool(val) and val[-1].value >= 1.0 - ZERO_VARIANCE_TOL and val[-1].hi is not None \
        and abs(val[-1].hi - 1.0) <= ZERO_VARIANCE_TOL
