"""Reward-hacking detectors: small pure functions that return an `Alert` (with its evidence) or None.

The seed's warning signs, one function each:

| detector                    | looks at                          | pattern                                        |
|-----------------------------|-----------------------------------|------------------------------------------------|
| `val_drop_reward_rise`      | history (val metric, train reward)| validation falls while reward rises (hacking)  |
| `val_plateau_reward_rising` | history                           | validation flat while reward rises (converged) |
| `reward_jump`               | history (train reward)            | sudden jump after a plateau                    |
| `perfect_scores`            | a step's groups                   | many groups with every rollout at the maximum  |
| `ngram_repetition`          | a step's groups                   | answers that repeat their own n-grams          |
| `identical_answers`         | a step's groups                   | every rollout of a group gives the same answer |
| `length_drift`              | history (train ``answer_chars``)  | answer length drifted by a factor              |
| `judge_disagreement`        | judged groups with ground truth   | judge orders pairs unlike ground truth         |

History-based detectors read rows with `groupwise.loop.series`; group-based ones read the last assistant
answer of each trajectory. Thresholds are arguments (LoopConfig carries the defaults). What to do about an
alert is `groupwise.loop.policy`'s job, not theirs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.loop.series import Row, mean, series, std, window_mean
from groupwise.loop.stopping import last_improvement

if TYPE_CHECKING:
    from groupwise.config import LoopConfig
    from groupwise.types import Trajectory, TrajectoryGroup

SEVERITIES = ("info", "warning", "critical")


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
    """The last assistant message's text ('' when there is none)."""
    for message in reversed(trajectory.messages()):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            return content or ""
    return ""


def _preview(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---------------------------------------------------------------- history-based


def _reward_change(history: list[Row], since_step: int, step: int, window: int) -> tuple[float, float] | None:
    """(mean train reward around since_step, mean of the last `window` steps), None without train rows."""
    train = series(history, "train", "reward", up_to=step)
    if not train:
        return None
    then = window_mean(train, since_step, window)
    if then is None:  # since_step is before the first train row (e.g. step 0): use the first value
        then = train[0][1]
    return then, window_mean(train, step, window)  # type: ignore[return-value]


def _reward_rose(history: list[Row], since_step: int, step: int, window: int,
                 min_rise: float) -> tuple[float, float] | None:
    """(reward then, reward now) when the mean train reward rose by at least `min_rise` since `since_step`."""
    change = _reward_change(history, since_step, step, window)
    if change is None or change[1] - change[0] < min_rise:
        return None
    return change


def val_drop_reward_rise(
    history: list[Row], *, step: int, metric: str = "accuracy", min_drop: float = 0.05,
    min_rise: float = 0.05, higher_is_better: bool = True, window: int = 3,
) -> Alert | None:
    """Validation fell at least `min_drop` below its best while train reward rose at least `min_rise`."""
    val = series(history, "val", metric, up_to=step)
    if len(val) < 2:
        return None
    sign = 1.0 if higher_is_better else -1.0
    best_step, best = max(val, key=lambda p: (sign * p[1], p[0]))  # latest of equal bests, as fit's best
    at, now = val[-1]
    drop = sign * (best - now)
    # Fires at the step of the validation that shows the drop, once, not on every later step.
    if at != step or at <= best_step or drop < min_drop:
        return None
    rose = _reward_rose(history, best_step, step, window, min_rise)
    if rose is None:
        return None
    then, reward_now = rose
    return Alert(
        "val_drop", "critical", step,
        f"reward hacking suspected: val/{metric} fell from {best:.4g} (step {best_step}) to {now:.4g} "
        f"(step {at}) while mean train reward rose from {then:.4g} to {reward_now:.4g}. "
        f"Inspect recent rollouts (`groupwise inspect`), fix the reward, resume from step {best_step}.",
        {"metric": f"val/{metric}", "best_step": best_step, "best": best, "val_step": at, "val_now": now,
         "drop": drop, "reward_then": then, "reward_now": reward_now, "reward_rise": reward_now - then},
    )


def val_plateau_reward_rising(
    history: list[Row], *, step: int, metric: str = "accuracy", min_delta: float = 0.0,
    min_rise: float = 0.05, evals: int = 2, higher_is_better: bool = True, window: int = 3,
) -> Alert | None:
    """`evals` validations in a row without improvement beyond min_delta while train reward rose."""
    val = series(history, "val", metric, up_to=step)
    if len(val) < evals + 1 or val[-1][0] != step:  # only at a validation step
        return None
    best_step, best = last_improvement(val, min_delta, higher_is_better)
    after = [p for p in val if p[0] > best_step]
    if len(after) < evals:
        return None
    rose = _reward_rose(history, best_step, step, window, min_rise)
    if rose is None:
        return None
    then, reward_now = rose
    return Alert(
        "val_plateau", "warning", step,
        f"converged: val/{metric} has not improved on {best:.4g} (step {best_step}) for {len(after)} "
        f"validations while mean train reward rose from {then:.4g} to {reward_now:.4g}; stop soon.",
        {"metric": f"val/{metric}", "best_step": best_step, "best": best, "evals_since": len(after),
         "val_now": val[-1][1], "reward_then": then, "reward_now": reward_now},
    )


def reward_jump(
    history: list[Row], *, step: int, window: int = 5, min_jump: float = 0.3, sigmas: float = 4.0,
    plateau_range: float = 0.1,
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
    history: list[Row], *, step: int, ratio: float = 2.0, key: str = "answer_chars", window: int = 3,
) -> Alert | None:
    """Mean answer length of the last `window` steps is `ratio` times longer (or shorter) than the first."""
    points = series(history, "train", key, up_to=step)
    if len(points) < window + 1:
        return None
    first = [v for _, v in points[:window]]
    last = [v for _, v in points[max(window, len(points) - window):]]
    ref, now = mean(first), mean(last)
    if ref <= 0:
        return None
    factor = now / ref
    if 1 / ratio < factor < ratio:
        return None
    return Alert(
        "length_drift", "warning", step,
        f"answer length drifted {factor:.2f}x: {ref:.1f} chars in the first {len(first)} steps, "
        f"{now:.1f} in the last {len(last)}. Length rewards and judges that prefer long answers get gamed.",
        {"key": key, "reference": ref, "now": now, "factor": factor,
         "reference_steps": [points[0][0], points[len(first) - 1][0]]},
    )


# ---------------------------------------------------------------- group-based


def perfect_scores(
    groups: Sequence["TrajectoryGroup"], *, step: int, max_reward: float = 1.0, share: float = 0.5,
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
    groups: Sequence["TrajectoryGroup"], *, step: int, n: int = 3, share: float = 0.5,
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


def identical_answers(groups: Sequence["TrajectoryGroup"], *, step: int, share: float = 0.5) -> Alert | None:
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
    groups: Sequence["TrajectoryGroup"], *, step: int, truth_key: str, min_agreement: float = 0.6,
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
    c = config
    gs = step if groups_step is None else groups_step
    found = [
        val_drop_reward_rise(history, step=step, metric=c.metric, min_drop=c.val_drop, min_rise=c.reward_rise,
                             higher_is_better=c.higher_is_better),
        val_plateau_reward_rising(history, step=step, metric=c.metric, min_delta=c.min_delta,
                                  min_rise=c.reward_rise, higher_is_better=c.higher_is_better),
        reward_jump(history, step=step, window=c.jump_window, min_jump=c.jump_min, sigmas=c.jump_sigmas,
                    plateau_range=c.plateau_range),
        length_drift(history, step=step, ratio=c.length_ratio),
        perfect_scores(groups, step=gs, max_reward=c.perfect_reward, share=c.perfect_share),
        ngram_repetition(groups, step=gs, n=c.repetition_ngram, share=c.repetition_share),
        identical_answers(groups, step=gs, share=c.identical_share),
        judge_disagreement(val_groups, step=step, truth_key=c.metric, min_agreement=c.min_judge_agreement)
        if val_groups else None,
    ]
    # val_drop supersedes val_plateau (a drop is also "no improvement").
    names = {a.name for a in found if a is not None}
    return [a for a in found if a is not None and not (a.name == "val_plateau" and "val_drop" in names)]
