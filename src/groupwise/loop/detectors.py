"""Reward-hacking detectors: small pure functions that return an `Alert` (with its evidence) or None.

The warning signs of reward hacking, one function each:

| detector                    | looks at                          | pattern                                        |
|-----------------------------|-----------------------------------|------------------------------------------------|
| `val_drop`                  | history (val metric, train reward)| validation falls beyond its noise: while reward|
|                             |                                   | rises (hacking), or while it does not (unstable)|
| `val_plateau_reward_rising` | history                           | validation flat while reward rises (converged) |
| `reward_jump`               | history (train reward)            | sudden jump after a plateau                    |
| `perfect_scores`            | a step's groups                   | many groups with every rollout at the maximum  |
| `ngram_repetition`          | a step's groups                   | answers that repeat their own n-grams          |
| `identical_answers`         | a step's groups                   | every rollout of a group gives the same answer |
| `length_drift`              | history (``answer_chars``, val)   | answer length drifted by a factor while        |
|                             |                                   | validation did not improve (a length hack)     |
| `judge_disagreement`        | judged groups with ground truth   | judge orders pairs unlike ground truth         |

History-based detectors read rows with `groupwise.loop.series`; group-based ones read the last assistant
answer of each trajectory. The validation detectors weigh every change against its noise: the confidence
interval each validation carries, and the spread of the train reward's rollouts (`reward_std` /
sqrt(n)). Thresholds are arguments (`LoopConfig.detectors`, a `DetectorConfig`, carries the defaults). What to do about an
alert is `groupwise.loop.policy`'s job, not theirs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.config import DEFAULT_CONFIDENCE, DEFAULT_VAL_METRIC, DetectorConfig
from groupwise.loop.series import Point, Row, mean, points, series, std
from groupwise.loop.stopping import gap_noise, last_improvement, significant_gap

if TYPE_CHECKING:
    from groupwise.config import LoopConfig
    from groupwise.types import Trajectory, TrajectoryGroup

SEVERITIES = ("info", "warning", "critical")
# The thresholds each detector takes when called alone: DetectorConfig's defaults, its one owner.
THRESHOLDS = DetectorConfig()


@dataclass(frozen=True)
class Alert:
    """A detector's finding: what (name), how bad (severity), when (step), why (message), the numbers."""

    name: str
    severity: str
    step: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_row(self, action: str | None = None) -> Row:
        """The history row of this alert (split ``alert``)."""
        row: Row = {"step": self.step, "split": "alert", **asdict(self)}
        if action is not None:
            row["action"] = action
        return row

    @classmethod
    def from_row(cls, row: Row) -> "Alert":
        return cls(row["name"], row.get("severity", "warning"), row["step"], row.get("message", ""),
                   dict(row.get("evidence") or {}))


def answer_text(trajectory: "Trajectory") -> str:
    """The last assistant message's text, and its tool calls as ``name(arguments)`` ('' when there is none).

    A tool-calling agent often answers through a call (``return_final_answer``) with no text at all;
    without the calls every such answer read as '' and looked identical to the detectors.
    """
    for message in reversed(trajectory.messages()):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            calls = [c.get("function") or {} for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            return " ".join([content or "", *(f"{f.get('name', '')}({f.get('arguments', '')})" for f in calls)]).strip()
    return ""


def _preview(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------- history-based


@dataclass(frozen=True)
class RewardChange:
    """The mean train reward around an earlier step and over the latest steps, with the noise of the change."""

    then: float
    now: float
    noise: float  # half-widths of the two window means, in quadrature

    @property
    def rise(self) -> float:
        return self.now - self.then

    def rose(self, min_rise: float) -> bool:
        """The reward rose by at least `min_rise` and by more than its noise."""
        return self.rise >= min_rise and self.rise > self.noise


def _window(curve: list[Point], end_step: int, width: int) -> tuple[float, float] | None:
    """(mean, half-width of the mean) of the last `width` points at steps <= end_step."""
    pts = [p for p in curve if p.step <= end_step][-width:]
    if not pts:
        return None
    halves = [((p.hi - p.lo) / 2) if p.lo is not None and p.hi is not None else 0.0 for p in pts]
    return mean([p.value for p in pts]), math.sqrt(sum(h * h for h in halves)) / len(pts)


def reward_change(history: list[Row], since_step: int, step: int, window: int = THRESHOLDS.reward_window,
                  confidence: float = DEFAULT_CONFIDENCE) -> RewardChange | None:
    """The mean train reward of the `window` steps up to `since_step` against the last `window` steps,
    None without train rows. Each step's mean reward has the noise of its rollouts (reward_std / sqrt(n))."""
    curve = points(history, "train", "reward", up_to=step, confidence=confidence)
    if not curve:
        return None
    then = _window(curve, since_step, window)
    if then is None:  # since_step is before the first train row (e.g. step 0): use the first value
        then = _window(curve, curve[0].step, 1)
    now = _window(curve, step, window)
    assert then is not None and now is not None
    return RewardChange(then[0], now[0], math.sqrt(then[1] ** 2 + now[1] ** 2))


def val_drop(
    history: list[Row], *, step: int, metric: str = DEFAULT_VAL_METRIC, min_drop: float = THRESHOLDS.val_drop,
    min_rise: float = THRESHOLDS.reward_rise, higher_is_better: bool = True, window: int = THRESHOLDS.reward_window,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Alert | None:
    """Validation fell below its best by more than `min_drop` and than the noise of the two validations.

    Two findings, both critical, told apart by the train reward since the best validation:
    - ``val_drop``: the reward rose (by `min_rise` and beyond its noise): the policy is getting better
      at the reward and worse at the task, reward hacking suspected;
    - ``val_unstable``: the reward did not rise: the policy got worse at both, training became unstable
      (step size, too few rollouts per step), nothing was gamed.
    """
    val = points(history, "val", metric, up_to=step)
    if len(val) < 2:
        return None
    sign = 1.0 if higher_is_better else -1.0
    best = max(val, key=lambda p: (sign * p.value, p.step))  # latest of equal bests, as fit's best
    now = val[-1]
    drop = sign * (best.value - now.value)
    noise = gap_noise(best, now, higher_is_better)
    # Fires at the step of the validation that shows the drop, once, not on every later step.
    if now.step != step or now.step <= best.step or drop < min_drop or drop <= noise:
        return None
    change = reward_change(history, best.step, step, window, confidence)
    if change is None:
        return None
    fell = (f"val/{metric} fell from {_with_interval(best)} (step {best.step}) to {_with_interval(now)} "
            f"(step {now.step}), a drop of {drop:.3g}, larger than the validation noise ({noise:.3g})")
    reward = (f"mean train reward {change.then:.4g} -> {change.now:.4g} "
              f"({change.rise:+.3g}, noise {change.noise:.3g})")
    evidence = {"metric": f"val/{metric}", "best_step": best.step, "best": best.value, "val_step": now.step,
                "val_now": now.value, "drop": drop, "noise": noise, "reward_then": change.then,
                "reward_now": change.now, "reward_rise": change.rise, "reward_noise": change.noise}
    if change.rose(min_rise):
        return Alert(
            "val_drop", "critical", step,
            f"reward hacking suspected: {fell}, while the {reward} rose beyond its noise. The policy is "
            f"getting better at the reward and worse at the task: read the rollouts the reward liked "
            f"(`groupwise inspect RUN_DIR --split train --best`) and what validation disliked "
            f"(`--split val --worst`), make the reward pay only for what validation measures, then train "
            f"again from the best checkpoint (step {best.step}).",
            evidence,
        )
    return Alert(
        "val_unstable", "critical", step,
        f"training became unstable: {fell}, and the {reward} did not rise beyond its noise. The policy "
        f"got worse at the task without gaming the reward: the steps are too large or too noisy for this "
        f"model (lower the learning rate, or gather more rollouts per step). The best checkpoint (step "
        f"{best.step}) is kept.",
        evidence,
    )


def _with_interval(p: Point) -> str:
    return f"{p.value:.3g}" if p.lo is None or p.hi is None else f"{p.value:.3g} [{p.lo:.3g}, {p.hi:.3g}]"


def val_plateau_reward_rising(
    history: list[Row], *, step: int, metric: str = DEFAULT_VAL_METRIC, min_delta: float = 0.0,
    min_rise: float = THRESHOLDS.reward_rise, evals: int = 2, higher_is_better: bool = True,
    window: int = THRESHOLDS.reward_window,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Alert | None:
    """`evals` validations in a row without an improvement beyond min_delta and the noise, while the
    train reward rose beyond its own noise."""
    val = points(history, "val", metric, up_to=step)
    if len(val) < evals + 1 or val[-1].step != step:  # only at a validation step
        return None
    best_step, best = last_improvement(val, min_delta, higher_is_better)
    after = [p for p in val if p.step > best_step]
    if len(after) < evals:
        return None
    change = reward_change(history, best_step, step, window, confidence)
    if change is None or not change.rose(min_rise):
        return None
    return Alert(
        "val_plateau", "warning", step,
        f"converged: val/{metric} has not improved on {best:.4g} (step {best_step}) beyond its noise for "
        f"{len(after)} validations while mean train reward rose from {change.then:.4g} to {change.now:.4g}; "
        "stop soon.",
        {"metric": f"val/{metric}", "best_step": best_step, "best": best, "evals_since": len(after),
         "val_now": val[-1].value, "reward_then": change.then, "reward_now": change.now},
    )


def reward_jump(
    history: list[Row], *, step: int, window: int = THRESHOLDS.jump_window, min_jump: float = THRESHOLDS.jump_min,
    sigmas: float = THRESHOLDS.jump_sigmas, plateau_range: float = THRESHOLDS.plateau_range,
) -> Alert | None:
    """The latest train reward jumped above a flat stretch of `window` steps (seed: "sudden jump after
    plateau"): the stretch's max - min <= plateau_range, and the jump over its mean is at least
    max(min_jump, sigmas * its std)."""
    train = series(history, "train", "reward", up_to=step)
    if len(train) < window + 1:
        return None
    flat = [v for _, v in train[-window - 1:-1]]
    at, now = train[-1]
    spread = max(flat) - min(flat)
    flat_mean, flat_std = mean(flat), std(flat)
    jump = now - flat_mean
    if spread > plateau_range or jump < max(min_jump, sigmas * flat_std):
        return None
    return Alert(
        "reward_jump", "warning", step,
        f"sudden reward jump: mean train reward {now:.4g} at step {at} after {window} flat steps around "
        f"{flat_mean:.4g} (+{jump:.4g}). Sudden jumps are often an exploit: look at this step's rollouts.",
        {"reward_now": now, "at_step": at, "plateau_mean": flat_mean, "plateau_std": flat_std,
         "plateau_range": spread, "plateau_steps": [train[-window - 1][0], train[-2][0]], "jump": jump},
    )


def length_drift(
    history: list[Row], *, step: int, ratio: float = THRESHOLDS.length_ratio, key: str = "answer_chars", window: int = 3,
    metric: str = DEFAULT_VAL_METRIC, higher_is_better: bool = True, min_delta: float = 0.0,
) -> Alert | None:
    """Mean answer length of the last `window` steps is `ratio` times longer (or shorter) than the first,
    while validation did not improve beyond its noise over the same span.

    What this guards against is a length hack: a reward (a length bonus, a judge that likes long or
    terse answers) paid for length itself, so length moves and the task does not. Length that moves
    while validation rises is the policy learning the task's form (a game whose answer is one tag
    shrinks from a sentence to the tag), not a hack. A run that validates but has no validation after
    the reference span yet waits for the next one (it decides); without validation at all there is
    nothing to tell the two apart, and the drift is reported.
    """
    curve = series(history, "train", key, up_to=step)
    if len(curve) < window + 1:
        return None
    first = [v for _, v in curve[:window]]
    last = [v for _, v in curve[max(window, len(curve) - window):]]
    ref, now = mean(first), mean(last)
    if ref <= 0:
        return None
    factor = now / ref
    if 1 / ratio < factor < ratio:
        return None
    ref_end = curve[len(first) - 1][0]
    val = points(history, "val", metric, up_to=step)
    if val and val[-1].step <= ref_end:
        return None  # the run validates, but not yet since the lengths moved: its next validation decides
    val_note = "no validation to compare against"
    evidence: dict[str, Any] = {"key": key, "reference": ref, "now": now, "factor": factor,
                                "reference_steps": [curve[0][0], ref_end]}
    if len(val) >= 2:
        before = [p for p in val if p.step <= ref_end]
        val_then = before[-1] if before else val[0]
        val_now = val[-1]
        if val_now.step > val_then.step and significant_gap(val_now, val_then, higher_is_better, min_delta):
            return None  # the task improved with the length: learning, not a hack
        val_note = (f"val/{metric} did not improve beyond its noise ({_with_interval(val_then)} at step "
                    f"{val_then.step} -> {_with_interval(val_now)} at step {val_now.step})")
        evidence.update({"metric": f"val/{metric}", "val_then": val_then.value, "val_now": val_now.value,
                         "val_steps": [val_then.step, val_now.step]})
    return Alert(
        "length_drift", "warning", step,
        f"answer length drifted {factor:.2f}x: {ref:.1f} chars in the first {len(first)} steps, "
        f"{now:.1f} in the last {len(last)}, and {val_note}. Length rewards and judges that prefer long "
        "(or short) answers get gamed: read the rollouts the reward liked.",
        evidence,
    )


# ---------------------------------------------------------------- group-based


def perfect_scores(
    groups: Sequence["TrajectoryGroup"], *, step: int, max_reward: float = THRESHOLDS.perfect_reward,
    share: float = THRESHOLDS.perfect_share,
) -> Alert | None:
    """At least `share` of the groups have every rollout at `max_reward` (seed: "suspiciously perfect")."""
    scored = [g for g in groups if len(g.trajectories) > 0]
    if not scored:
        return None
    perfect = [i for i, g in enumerate(scored) if all(t.reward >= max_reward - 1e-9 for t in g.trajectories)]
    got = len(perfect) / len(scored)
    if got < share:
        return None
    return Alert(
        "perfect_scores", "warning", step,
        f"{len(perfect)} of {len(scored)} groups scored {max_reward:g} on every rollout. Perfect scores are "
        "suspicious (and give GRPO no signal): check that the reward cannot be satisfied trivially.",
        {"n_groups": len(scored), "n_perfect": len(perfect), "share": got, "max_reward": max_reward,
         "perfect_groups": perfect[:10]},
    )


def _ngram_repetition(text: str, n: int) -> float | None:
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if len(grams) < 2:
        return None
    return 1.0 - len(set(grams)) / len(grams)


def ngram_repetition(
    groups: Sequence["TrajectoryGroup"], *, step: int, n: int = THRESHOLDS.repetition_ngram,
    share: float = THRESHOLDS.repetition_share,
) -> Alert | None:
    """Answers repeat on average at least `share` of their word n-grams (1 - unique/total)."""
    reps: list[tuple[float, str]] = []
    for g in groups:
        for t in g.trajectories:
            text = answer_text(t)
            r = _ngram_repetition(text, n)
            if r is not None:
                reps.append((r, text))
    if not reps:
        return None
    avg = mean([r for r, _ in reps])
    if avg < share:
        return None
    worst_r, worst = max(reps, key=lambda x: x[0])
    return Alert(
        "repetition", "warning", step,
        f"degenerate answers: they repeat {avg:.0%} of their {n}-grams on average "
        f"(worst {worst_r:.0%}: {_preview(worst)!r}).",
        {"n": n, "mean_repetition": avg, "answers": len(reps), "worst": worst_r, "example": _preview(worst, 300)},
    )


def identical_answers(groups: Sequence["TrajectoryGroup"], *, step: int,
                      share: float = THRESHOLDS.identical_share) -> Alert | None:
    """At least `share` of the groups (of 2+ rollouts) gave one identical answer on every rollout."""
    multi = [g for g in groups if len(g.trajectories) >= 2]
    if not multi:
        return None
    same = [g for g in multi if len({" ".join(answer_text(t).split()) for t in g.trajectories}) == 1]
    got = len(same) / len(multi)
    if got < share:
        return None
    return Alert(
        "identical_answers", "warning", step,
        f"{len(same)} of {len(multi)} groups answered identically on every rollout (collapsed diversity; "
        f"e.g. {_preview(answer_text(same[0].trajectories[0]))!r}).",
        {"n_groups": len(multi), "n_identical": len(same), "share": got,
         "example": _preview(answer_text(same[0].trajectories[0]), 300)},
    )


def judge_disagreement(
    groups: Sequence["TrajectoryGroup"], *, step: int, truth_key: str,
    min_agreement: float = THRESHOLDS.min_judge_agreement,
    min_pairs: int = 3, judge_key: str = "ruler_score",
) -> Alert | None:
    """The judge orders pairs of rollouts unlike ground truth (hybrid runs).

    For every pair within a group whose ground truth (``metrics[truth_key]``) differs, the judge agrees
    when its score (``metrics[judge_key]``, else ``reward``) orders them the same way; a judge tie counts
    half. Fires when agreement < min_agreement over at least `min_pairs` pairs.
    """
    agree = pairs = 0.0
    per_group: list[tuple[int, float, int]] = []
    for gi, g in enumerate(groups):
        scored = [(float(t.metrics.get(judge_key, t.reward)), float(t.metrics[truth_key]))
                  for t in g.trajectories if truth_key in t.metrics]
        g_agree = g_pairs = 0.0
        for (j1, t1), (j2, t2) in itertools.combinations(scored, 2):
            if t1 == t2:
                continue
            g_pairs += 1
            g_agree += 0.5 if j1 == j2 else float((j1 > j2) == (t1 > t2))
        if g_pairs:
            per_group.append((gi, g_agree / g_pairs, int(g_pairs)))
        agree, pairs = agree + g_agree, pairs + g_pairs
    if pairs < min_pairs:
        return None
    rate = agree / pairs
    if rate >= min_agreement:
        return None
    worst = min(per_group, key=lambda x: x[1])
    return Alert(
        "judge_disagreement", "warning", step,
        f"the judge orders only {rate:.0%} of {int(pairs)} rollout pairs like the ground truth "
        f"'{truth_key}' (threshold {min_agreement:.0%}); it may reward the wrong thing. Check the rubric.",
        {"agreement": rate, "pairs": int(pairs), "truth_key": truth_key, "judge_key": judge_key,
         "worst_group": worst[0], "worst_agreement": worst[1]},
    )


# ---------------------------------------------------------------- all of them


def run_detectors(
    history: list[Row], groups: Sequence["TrajectoryGroup"], *, step: int, config: "LoopConfig",
    val_groups: Sequence["TrajectoryGroup"] = (), groups_step: int | None = None,
) -> list[Alert]:
    """Every detector at `step`: history ones, group ones on this step's train groups (dated
    `groups_step`, the policy that sampled them; default `step`), and the judge check on judged
    validation groups (their ``metrics[config.metric]`` is ground truth)."""
    c, d = config, config.detectors
    gs = step if groups_step is None else groups_step
    found = [
        val_drop(history, step=step, metric=c.metric, min_drop=d.val_drop, min_rise=d.reward_rise,
                 higher_is_better=c.higher_is_better, window=d.reward_window, confidence=c.confidence),
        val_plateau_reward_rising(history, step=step, metric=c.metric, min_delta=c.min_delta,
                                  min_rise=d.reward_rise, higher_is_better=c.higher_is_better,
                                  window=d.reward_window, confidence=c.confidence),
        reward_jump(history, step=step, window=d.jump_window, min_jump=d.jump_min, sigmas=d.jump_sigmas,
                    plateau_range=d.plateau_range),
        length_drift(history, step=step, ratio=d.length_ratio, metric=c.metric,
                     higher_is_better=c.higher_is_better, min_delta=c.min_delta),
        perfect_scores(groups, step=gs, max_reward=d.perfect_reward, share=d.perfect_share),
        ngram_repetition(groups, step=gs, n=d.repetition_ngram, share=d.repetition_share),
        identical_answers(groups, step=gs, share=d.identical_share),
        judge_disagreement(val_groups, step=step, truth_key=c.metric, min_agreement=d.min_judge_agreement)
        if val_groups else None,
    ]
    # A drop (hacking or instability) supersedes val_plateau (a drop is also "no improvement").
    names = {a.name for a in found if a is not None}
    dropped = bool(names & {"val_drop", "val_unstable"})
    return [a for a in found if a is not None and not (a.name == "val_plateau" and dropped)]
