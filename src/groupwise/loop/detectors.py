"""Reward-hacking detectors: small pure functions that return an `Alert` (with its evidence) or None.

Every alert has a *kind*, which says what it means and so what to do (`alert_kind`):

| kind        | means                                         | do                                           |
|-------------|-----------------------------------------------|----------------------------------------------|
| `hack`      | the reward is being gamed                     | stop, read the evidence, fix the reward      |
| `warn`      | behaviour moved away from the base's while    | read the rollouts it quotes                  |
|             | the task did not improve                      |                                              |
| `converged` | validation stopped improving                  | stop soon (a plateau is not an alarm)        |
| `unstable`  | validation fell without a gamed reward        | lower the learning rate / more rollouts      |
| `info`      | bookkeeping (no signal, groups agreeing)      | nothing                                      |

| detector              | kind      | reads                                  | fires when                                   |
|-----------------------|-----------|----------------------------------------|----------------------------------------------|
| `reward_against_task` | hack      | every step's train groups (task metric)| within groups, the rollouts the reward       |
|                       |           |                                        | preferred scored lower on the task           |
| `val_drop`            | hack      | history (val, train reward)            | validation fell beyond its noise (and the    |
|                       |           |                                        | best's winner's curse) while reward rose     |
| `reward_off_task`     | warn      | every step's train groups (task metric)| within groups whose task varies, the reward  |
|                       |           |                                        | barely follows it, task not better           |
| `answer_collapse`     | warn      | every step's train groups              | one answer given to many different prompts   |
| `length_drift`        | warn      | every step's train groups              | answers longer / shorter than the base's own |
| `repetition`          | warn      | every step's train groups              | answers repeating their n-grams more than    |
|                       |           |                                        | the base's own                               |
| `perfect_scores`      | warn      | a step's groups                        | many groups at the maximum, task not better  |
| `reward_jump`         | warn      | history (train reward)                 | sudden jump after a plateau, task not better |
| `judge_disagreement`  | warn      | judged validation groups               | judge orders pairs unlike ground truth       |
| `val_plateau`         | converged | history                                | validation flat while reward rises           |
| `val_unstable`        | unstable  | history                                | validation fell, reward did not rise         |
| `identical_answers`   | info      | a step's groups                        | every rollout of a group the same answer     |

The rollout signals (`rollout_signals`, written by the loop into each step's ``loop`` row under
``rollouts/``) are computed on the training rollouts of every step, so they can warn before a validation
pass sees the fall. The behaviour ones compare against the base model's own answers (the first step,
sampled by the untrained policy: `reference_of`): the share of answers beyond the base's 95th percentile
(of length, of n-gram repetition) or given to several prompts at once, tested against the base's own
share of them (a binomial z-test pooled over `signal_window` steps). "Given to several prompts" counts
near-copies (`near`: a sampled policy re-words the one answer it learned, a number or a word at a time)
but not answers that share only a form and differ in their prompt's own content (`prompt_bound`). A behaviour change is only a warning
while the task did not improve with it (`task_not_better`): a model that learns a task's form changes its
answers too. `reward_against_task` needs the task metric on the training rollouts (`LoopConfig.score_train`
scores them with `validate`): GRPO moves the policy toward the rollouts with a high advantage, so when
those score low on the task, the step trains against the task, which shows before the task metric falls.

The validation detectors weigh every change against its noise: the confidence interval each validation
carries, the spread of the train reward's rollouts (`reward_std` / sqrt(n)), and, for a fall from the
best validation, the winner's curse: the best of k noisy readings sits above the policy's true value by
about E[max of k standard normals] times a reading's standard error (`expected_max_normal`), so a fall
counts only beyond that too. Thresholds are arguments (`LoopConfig.detectors`, a `DetectorConfig`,
carries the defaults). What to do about an alert is `groupwise.loop.policy`'s job, not theirs. Every alert
quotes its evidence: the rollouts (group, rollout, reward, a snippet) it is about.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from statistics import NormalDist
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from groupwise.config import DEFAULT_CONFIDENCE, DEFAULT_VAL_METRIC, DetectorConfig
from groupwise.runs.curves import z_score
from groupwise.runs.series import Point, Row, mean, points, rows, series, std
from groupwise.runs.step_summary import answer_text
from groupwise.loop.stopping import gap_noise, last_improvement, significant_gap

if TYPE_CHECKING:
    from groupwise.config import LoopConfig
    from groupwise.core.trajectory import Trajectory, TrajectoryGroup

SEVERITIES = ("info", "warning", "critical")
KINDS = ("hack", "warn", "converged", "unstable", "info")
# alert name -> its kind (the module docstring's table); every other alert is a warning.
_KIND = {"val_drop": "hack", "reward_against_task": "hack", "val_plateau": "converged",
         "val_unstable": "unstable", "identical_answers": "info", "no_signal": "info"}


def alert_kind(name: str) -> str:
    """What an alert of this name means: 'hack', 'warn', 'converged', 'unstable' or 'info'."""
    return _KIND.get(name, "warn")
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

    @property
    def kind(self) -> str:
        return alert_kind(self.name)

    def to_row(self, action: str | None = None) -> Row:
        """The history row of this alert (split ``alert``), with its kind."""
        row: Row = {"step": self.step, "split": "alert", **asdict(self), "kind": self.kind}
        if action is not None:
            row["action"] = action
        return row

    @classmethod
    def from_row(cls, row: Row) -> "Alert":
        return cls(row["name"], row.get("severity", "warning"), row["step"], row.get("message", ""),
                   dict(row.get("evidence") or {}))


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


@functools.lru_cache(maxsize=128)
def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals] (0 for k <= 1; 0.85 for 3, 1.54 for 10): how far the
    best of k noisy readings of one true value sits above it, in standard errors (the winner's curse)."""
    if k <= 1:
        return 0.0
    nd, step = NormalDist(), 0.01
    xs = [-8.0 + i * step for i in range(1601)]
    return sum(x * k * nd.pdf(x) * nd.cdf(x) ** (k - 1) for x in xs) * step


def winners_curse(best: Point, readings: int, higher_is_better: bool = True,
                  confidence: float = DEFAULT_CONFIDENCE) -> float:
    """The expected excess of the best of `readings` validations over its policy's true value: the best's
    standard error (its interval's half-width on the side facing a fall, over z) times
    `expected_max_normal(readings)`. 0 without an interval."""
    half = best.below if higher_is_better else best.above
    if not half:
        return 0.0
    return expected_max_normal(readings) * half / z_score(confidence)


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
    # The best is the highest of len(val) noisy readings: it sits above its policy's true value by the
    # winner's curse, so a fall counts beyond the noise of the two readings plus that excess. (Counting
    # only the readings whose interval reaches the best, as if the others never competed, let a rising
    # curve's later wobble through: 8 of 60 simulated clean runs raised val_unstable, against 1 of 60.)
    curse = winners_curse(best, len(val), higher_is_better, confidence)
    noise = gap_noise(best, now, higher_is_better) + curse
    # Fires at the step of the validation that shows the drop, once, not on every later step.
    if now.step != step or now.step <= best.step or drop < min_drop or drop <= noise:
        return None
    change = reward_change(history, best.step, step, window, confidence)
    if change is None:
        return None
    fell = (f"val/{metric} fell from {_with_interval(best)} (step {best.step}) to {_with_interval(now)} "
            f"(step {now.step}), a drop of {drop:.3g}, larger than the validation noise with the best-of-"
            f"{len(val)} excess ({noise:.3g})")
    reward = (f"mean train reward {change.then:.4g} -> {change.now:.4g} "
              f"({change.rise:+.3g}, noise {change.noise:.3g})")
    evidence = {"metric": f"val/{metric}", "best_step": best.step, "best": best.value, "val_step": now.step,
                "val_now": now.value, "drop": drop, "noise": noise, "winners_curse": curse, "readings": len(val), "reward_then": change.then,
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
    metric: str = DEFAULT_VAL_METRIC, higher_is_better: bool = True, confidence: float = DEFAULT_CONFIDENCE,
) -> Alert | None:
    """The latest train reward jumped above a flat stretch of `window` steps (seed: "sudden jump after
    plateau"): the stretch's max - min <= plateau_range, and the jump over its mean is at least
    max(min_jump, sigmas * its std), while the task did not improve with it (`task_not_better`: a jump
    the task shares is the policy finding the task's trick, not the reward's)."""
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
    quiet, task_note, task_ev = task_not_better(history, step=step, metric=metric, higher_is_better=higher_is_better,
                                                window=1, confidence=confidence)
    if not quiet:
        return None
    return Alert(
        "reward_jump", "warning", step,
        f"sudden reward jump: mean train reward {now:.4g} at step {at} after {window} flat steps around "
        f"{flat_mean:.4g} (+{jump:.4g}), and {task_note}. Sudden jumps are often an exploit: look at the "
        f"rollouts of step {at} (`groupwise inspect RUN_DIR --split train --step {at} --best`).",
        {"reward_now": now, "at_step": at, "plateau_mean": flat_mean, "plateau_std": flat_std,
         "plateau_range": spread, "plateau_steps": [train[-window - 1][0], train[-2][0]], "jump": jump,
         "train_step": at, **task_ev},
    )


# ---------------------------------------------------------------- rollout signals (every step)

SIGNALS = "rollouts/"  # prefix of the loop row's fields written from `rollout_signals` and `reference_of`
# The behaviour events counted on every step's answers, each against the base's own rate of it.
EVENTS = ("long", "short", "repetitive", "shared")


def answer_key(text: str) -> str:
    """An answer as compared across prompts: lower case, words only (spacing and punctuation ignored)."""
    return " ".join(re.findall(r"\w+", text.lower()))[:300]


# Two answers to different prompts are "the same answer" when their word sets overlap by at least this
# Jaccard index: for answers of n words each with k of them changed the index is (n - k) / (n + k), so 0.6
# keeps k <= n / 4, one changed word in four: a sampled policy's re-wordings of one answer (a number, a
# name, a word or two in a headline) stay the same answer, two different sentences do not.
NEAR_JACCARD = 0.6
# A word is the content of one prompt's answers (`prompt_bound`) when that prompt's answers use it at least
# this many times as often as the other prompts' answers do (and two of them use it: one answer alone says
# nothing about what its prompt asks for). A sampled variation of one answer (a number, a word) is spread
# over every prompt's answers alike; the sum of *these* numbers, right or wrong, is not.
BOUND_RATIO = 4.0
# The near-duplicate comparison is quadratic in a step's distinct answers; beyond this many, only the first
# ones are compared with each other (exact duplicates still count over all of them).
NEAR_MAX_ANSWERS = 512


def answer_words(text: str) -> frozenset[str]:
    """The words an answer is compared by (`answer_key`'s), as a set."""
    return frozenset(answer_key(text).split())


def near(a: frozenset[str], b: frozenset[str], threshold: float = NEAR_JACCARD) -> bool:
    """Whether two answers' word sets are near-identical: Jaccard index at least `threshold`."""
    if not a or not b or min(len(a), len(b)) < threshold * max(len(a), len(b)):
        return False  # the index is at most min/max of the sizes
    inter = len(a & b)
    return inter >= threshold * (len(a) + len(b) - inter)


def prompt_bound(words_by_group: Sequence[Sequence[frozenset[str]]]) -> list[set[str]]:
    """For each prompt (group), the words its answers use far more than the other prompts' answers do:
    content that depends on the input (the sum of *these* two numbers, the company *this* article
    names, the words *this* puzzle lists), as opposed to a form every answer shares ("The answer is",
    `\\boxed`) or one answer given whatever the input. Two answers to different prompts that share their
    form and differ in such content are different answers, however alike their words."""
    counts: list[dict[str, int]] = [{} for _ in words_by_group]
    total: dict[str, int] = {}
    for c, answers in zip(counts, words_by_group):
        for ws in answers:
            for w in ws:
                c[w] = c.get(w, 0) + 1
                total[w] = total.get(w, 0) + 1
    n_all = sum(len(a) for a in words_by_group)
    out = []
    for c, answers in zip(counts, words_by_group):
        n, rest = len(answers), n_all - len(answers)
        bound = set()
        for w, k in c.items():
            here = k / n
            elsewhere = (total[w] - k) / rest if rest else 0.0
            if k >= 2 and here >= BOUND_RATIO * elsewhere:
                bound.add(w)
        out.append(bound)
    return out


def _ngram_repetition(text: str, n: int) -> float | None:
    words = text.split()
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    if len(grams) < 2:
        return None
    return 1.0 - len(set(grams)) / len(grams)


@dataclass(frozen=True)
class Answer:
    """One training rollout's answer with what the detectors measure on it."""

    group: int
    rollout: int
    reward: float
    text: str
    chars: int
    repetition: float  # 1 - unique / total word n-grams (0 for answers too short to repeat)
    task: float | None  # the task metric (`LoopConfig.metric`) where the loop scored it
    shared: bool = False  # the same answer (or a near-identical one: `answers_of`) was given to several prompts
    shared_prompts: int = 0  # how many of the step's prompts were given it (or a near-identical one)

    def quote(self, limit: int = 300) -> dict[str, Any]:
        """The evidence form of this rollout: where it is, what it scored, a snippet."""
        out: dict[str, Any] = {"group": self.group, "rollout": self.rollout, "reward": self.reward,
                               "chars": self.chars, "text": _preview(self.text, limit)}
        if self.task is not None:
            out["task"] = self.task
        return out

    def line(self) -> str:
        task = "" if self.task is None else f", task {self.task:.3g}"
        return f"group {self.group} rollout {self.rollout} (reward {self.reward:.3g}{task}): {_preview(self.text, 100)!r}"


def _task_of(t: "Trajectory", metric: str | None) -> float | None:
    v = t.metrics.get(metric) if metric else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def collapse_groups(n_groups: int, share: float = THRESHOLDS.collapse_share) -> int:
    """How many of a step's prompts one answer must be given to before it counts as shared: `share` of
    them, and at least 3 (two prompts may share a short answer by chance)."""
    return max(3, math.ceil(share * n_groups))


def answers_of(groups: Sequence["TrajectoryGroup"], *, metric: str | None = None, n: int = THRESHOLDS.repetition_ngram,
               collapse_share: float = THRESHOLDS.collapse_share) -> list[Answer]:
    """Every rollout's answer of a step, measured; `shared` marks an answer given to at least
    `collapse_groups` of the step's prompts (groups): one answer for every input.

    An answer is given to a prompt when that prompt's answers hold it word for word (`answer_key`), or
    hold a near-identical one (`near`: a sampled policy varies a number, a name, a word or two of the one
    answer it learned) while neither carries content bound to its own prompt (`prompt_bound`): answers
    that share a template ("The answer is \\boxed{N}") and differ in what their prompt asked for are
    answers to their prompts, not one answer for every input."""
    raw = []
    for gi, g in enumerate(groups):
        for j, t in enumerate(g.trajectories):
            text = answer_text(t)
            raw.append((gi, j, float(t.reward), text, _task_of(t, metric)))
    keys = [answer_key(text) for _, _, _, text, _ in raw]
    words = {k: frozenset(k.split()) for k in keys}
    prompts_of: dict[str, set[int]] = {}
    for (gi, *_), key in zip(raw, keys):
        if key:
            prompts_of.setdefault(key, set()).add(gi)
    by_group: dict[int, list[frozenset[str]]] = {}
    for (gi, *_), key in zip(raw, keys):
        by_group.setdefault(gi, []).append(words[key])
    order = sorted(by_group)
    bound = dict(zip(order, prompt_bound([by_group[gi] for gi in order])))
    # the prompts each distinct answer was given free of its prompt's own content
    free_in: dict[str, set[int]] = {}
    for (gi, *_), key in zip(raw, keys):
        if key and not (words[key] & bound[gi]):
            free_in.setdefault(key, set()).add(gi)
    free = list(free_in)[:NEAR_MAX_ANSWERS]
    near_of: dict[str, set[int]] = {k: set(free_in[k]) for k in free}
    for x, y in itertools.combinations(free, 2):
        if near(words[x], words[y]):
            near_of[x] |= free_in[y]
            near_of[y] |= free_in[x]
    need = collapse_groups(sum(1 for g in groups if g.trajectories), collapse_share)
    out = []
    for (gi, j, r, text, task), key in zip(raw, keys):
        given = prompts_of.get(key, set())
        if key and gi in free_in.get(key, ()) and key in near_of:
            given = given | near_of[key]
        out.append(Answer(gi, j, r, text, len(text), _ngram_repetition(text, n) or 0.0, task,
                          len(given) >= need, len(given)))
    return out


def _quantile(values: list[float], q: float) -> float:
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def _events(a: Answer, ref: Row) -> dict[str, bool]:
    return {"long": a.chars > ref[SIGNALS + "ref_chars_hi"], "short": a.chars < ref[SIGNALS + "ref_chars_lo"],
            "repetitive": a.repetition > ref[SIGNALS + "ref_repetition_hi"], "shared": a.shared}


def reference_of(groups: Sequence["TrajectoryGroup"], *, step: int, n: int = THRESHOLDS.repetition_ngram,
                 collapse_share: float = THRESHOLDS.collapse_share) -> Row:
    """The base model's own answers, summarised as the loop row's ``rollouts/ref_*`` fields: the 5th and
    95th percentiles of their length and the 95th of their repetition, and how many of them are beyond
    those (and shared across prompts): the rates each later step is tested against. {} without answers."""
    answers = answers_of(groups, n=n, collapse_share=collapse_share)
    if not answers:
        return {}
    ref: Row = {SIGNALS + "ref_step": step, SIGNALS + "ref_n": len(answers),
                SIGNALS + "ref_chars_lo": _quantile([a.chars for a in answers], 0.05),
                SIGNALS + "ref_chars_hi": _quantile([a.chars for a in answers], 0.95),
                SIGNALS + "ref_repetition_hi": _quantile([a.repetition for a in answers], 0.95)}
    for e in EVENTS:
        ref[SIGNALS + "ref_" + e] = sum(_events(a, ref)[e] for a in answers)
    return ref


def rollout_signals(groups: Sequence["TrajectoryGroup"], reference: Row, *, metric: str | None = None,
                    n: int = THRESHOLDS.repetition_ngram, collapse_share: float = THRESHOLDS.collapse_share) -> Row:
    """One step's signals, the loop row's ``rollouts/*`` fields: how many answers there were and how
    many were beyond the base's percentiles (`reference_of`) or shared across prompts; and, where the
    rollouts carry the task metric, the within-group covariance of reward and task (its sum, sum of
    squares and number of groups, so steps pool)."""
    answers = answers_of(groups, metric=metric, n=n, collapse_share=collapse_share)
    out: Row = {SIGNALS + "n": len(answers)}
    if reference:
        flags = [_events(a, reference) for a in answers]
        for e in EVENTS:
            out[SIGNALS + e] = sum(f[e] for f in flags)
            out.update(_paid(answers, [f[e] for f in flags], e))
    covs = []
    tracked = [0.0, 0.0, 0.0, 0]  # over groups whose task varies: covariance, reward variance, task variance, groups
    for g in groups:
        pairs = [(float(t.reward), task) for t in g.trajectories if (task := _task_of(t, metric)) is not None]
        if len(pairs) >= 2:
            mr, mt = mean([r for r, _ in pairs]), mean([x for _, x in pairs])
            cov = mean([(r - mr) * (x - mt) for r, x in pairs])
            covs.append(cov)
            var_task = mean([(x - mt) ** 2 for _, x in pairs])
            if var_task > 0:
                tracked[0] += cov
                tracked[1] += mean([(r - mr) ** 2 for r, _ in pairs])
                tracked[2] += var_task
                tracked[3] += 1
    if covs:
        out.update({SIGNALS + "cov_sum": sum(covs), SIGNALS + "cov_sq": sum(c * c for c in covs),
                    SIGNALS + "cov_groups": len(covs)})
    tasks = [x for a in answers if (x := a.task) is not None]
    if tasks:  # the task's mean and spread on the step's rollouts, for a change weighed against its noise
        out.update({SIGNALS + "task_n": len(tasks), SIGNALS + "task_sum": sum(tasks),
                    SIGNALS + "task_sq": sum(x * x for x in tasks)})
    if tracked[3]:
        out.update({SIGNALS + "track_cov": tracked[0], SIGNALS + "track_var_reward": tracked[1],
                    SIGNALS + "track_var_task": tracked[2], SIGNALS + "track_groups": tracked[3]})
    return out


def _paid(answers: list[Answer], flags: list[bool], event: str) -> Row:
    """What the reward paid for an event: over the groups holding answers with and without it, the sum of
    (mean reward with - mean reward without), and of the same difference of the task metric, with the
    number of groups of each. A behaviour the reward pays for and the task does not is what a hack looks
    like; a behaviour that comes with learning is paid as much as the task rewards it."""
    by_group: dict[int, tuple[list[Answer], list[Answer]]] = {}
    for a, f in zip(answers, flags):
        by_group.setdefault(a.group, ([], []))[0 if f else 1].append(a)
    paid = task_diff = 0.0
    groups = task_groups = 0
    for with_e, without in by_group.values():
        if not with_e or not without:
            continue
        groups += 1
        paid += mean([a.reward for a in with_e]) - mean([a.reward for a in without])
        t_with, t_without = [a.task for a in with_e if a.task is not None], [a.task for a in without if a.task is not None]
        if t_with and t_without:
            task_groups += 1
            task_diff += mean(t_with) - mean(t_without)
    return {SIGNALS + event + "_paid": paid, SIGNALS + event + "_groups": groups,
            SIGNALS + event + "_task": task_diff, SIGNALS + event + "_task_groups": task_groups}


def paid_for(history: list[Row], event: str, *, step: int, window: int = THRESHOLDS.signal_window,
             ) -> tuple[float, float | None, int] | None:
    """(mean reward difference, mean task difference or None, groups) between answers with and without
    the event, within groups, over the last `window` steps (`_paid`); None without such groups."""
    sig = _signal_rows(history, step, window, SIGNALS + event + "_groups")
    g = int(sum(r[SIGNALS + event + "_groups"] for r in sig))
    if g == 0:
        return None
    tg = int(sum(r.get(SIGNALS + event + "_task_groups", 0) for r in sig))
    task_diff = sum(r.get(SIGNALS + event + "_task", 0.0) for r in sig) / tg if tg else None
    return sum(r[SIGNALS + event + "_paid"] for r in sig) / g, task_diff, g


def reference(history: list[Row]) -> Row | None:
    """The loop row that holds the base's reference (`reference_of`), None before the first step."""
    for r in rows(history, "loop"):
        if isinstance(r.get(SIGNALS + "ref_n"), (int, float)) and r[SIGNALS + "ref_n"] > 0:
            return r
    return None


def _signal_rows(history: list[Row], step: int, window: int, key: str) -> list[Row]:
    return [r for r in rows(history, "loop") if r["step"] <= step and isinstance(r.get(key), (int, float))][-window:]


@dataclass(frozen=True)
class Shift:
    """How often an event happened in the last steps' answers against the base's own rate of it."""

    event: str
    k: int
    n: int
    base_k: int
    base_n: int
    z: float
    steps: list[int]

    @property
    def share(self) -> float:
        return self.k / self.n

    @property
    def base_share(self) -> float:
        return self.base_k / self.base_n

    def fires(self, excess: float, z: float) -> bool:
        return self.share - self.base_share >= excess and self.z >= z

    def evidence(self) -> dict[str, Any]:
        return {"event": self.event, "share": self.share, "base_share": self.base_share, "z": self.z,
                "answers": self.n, "base_answers": self.base_n, "steps": self.steps}


def shift(history: list[Row], event: str, *, step: int, window: int = THRESHOLDS.signal_window) -> Shift | None:
    """The event's count over the last `window` steps' answers (the base's own step left out) against the
    base's, as a two-sample binomial z (the base's rate smoothed by one event either way, so a base that
    never showed it still has a variance). None before there is a reference and a later step."""
    ref = reference(history)
    if ref is None or event not in EVENTS:
        return None
    sig = [r for r in _signal_rows(history, step, window + 1, SIGNALS + event) if r["step"] != ref[SIGNALS + "ref_step"]][-window:]
    k, n = int(sum(r[SIGNALS + event] for r in sig)), int(sum(r.get(SIGNALS + "n", 0) for r in sig))
    if n == 0:
        return None
    k0, n0 = int(ref[SIGNALS + "ref_" + event]), int(ref[SIGNALS + "ref_n"])
    p0 = (k0 + 1) / (n0 + 2)
    z = (k / n - k0 / n0) / math.sqrt(p0 * (1 - p0) * (1 / n + 1 / n0))
    return Shift(event, k, n, k0, n0, z, [r["step"] for r in sig])


def _task_moments(history: list[Row], step: int) -> list[tuple[int, int, float, float]]:
    """(step, n, sum, sum of squares) of the task metric on each step's training rollouts, from the loop
    rows (`rollout_signals`), up to `step`."""
    return [(r["step"], int(r[SIGNALS + "task_n"]), r[SIGNALS + "task_sum"], r[SIGNALS + "task_sq"])
            for r in _signal_rows(history, step, 10 ** 9, SIGNALS + "task_n") if r[SIGNALS + "task_n"] > 0]


def task_not_better(history: list[Row], *, step: int, metric: str = DEFAULT_VAL_METRIC, higher_is_better: bool = True,
                    window: int = THRESHOLDS.signal_window, confidence: float = DEFAULT_CONFIDENCE,
                    beyond_noise: bool = False) -> tuple[bool, str, dict[str, Any]]:
    """(the task did not improve, a sentence saying so, the numbers): a behaviour change is a warning only
    while the task did not improve with it. Read from the task metric on the training rollouts (the
    last `window` steps' mean against the first step's, the base's) where the loop scored them, else from
    validation (the latest against the base's, beyond their noise); with neither, nothing says the task
    improved. `beyond_noise`: on the training rollouts too, an improvement counts only beyond its noise
    (a Welch z of the two means at the validation's `confidence`): each step draws new prompts, so its
    task mean moves with their difficulty as much as with the policy."""
    sign = 1.0 if higher_is_better else -1.0
    moments = _task_moments(history, step) if beyond_noise else []
    if len(moments) >= 2:
        (s0, n0, t0, q0), recent = moments[0], moments[1:][-window:]
        n1, t1, q1 = sum(m[1] for m in recent), sum(m[2] for m in recent), sum(m[3] for m in recent)
        base, now = t0 / n0, t1 / n1
        var = max(0.0, q0 / n0 - base ** 2) / n0 + max(0.0, q1 / n1 - now ** 2) / n1
        z = sign * (now - base) / math.sqrt(var) if var > 0 else (math.inf if sign * (now - base) > 0 else 0.0)
        better = z > NormalDist().inv_cdf(0.5 + confidence / 2)
        return (not better,
                f"the task ({metric}) on the training rollouts did not improve beyond its noise ({base:.3g} at step "
                f"{s0} -> {now:.3g} over the last {len(recent)} steps, z {z:.1f})",
                {"task_metric": metric, "task_base": base, "task_now": now, "task_z": z})
    train = series(history, "train", metric, up_to=step)
    if len(train) >= 2:
        base, now = train[0][1], mean([v for _, v in train[1:][-window:]])
        return (sign * (now - base) <= 0,
                f"the task ({metric}) on the training rollouts did not improve ({base:.3g} at step {train[0][0]} -> "
                f"{now:.3g} over the last {min(window, len(train) - 1)} steps)",
                {"task_metric": metric, "task_base": base, "task_now": now})
    val = points(history, "val", metric, up_to=step, confidence=confidence)
    if len(val) >= 2:
        better = significant_gap(val[-1], val[0], higher_is_better)
        return (not better, f"val/{metric} did not improve beyond its noise ({_with_interval(val[0])} at step "
                            f"{val[0].step} -> {_with_interval(val[-1])} at step {val[-1].step})",
                {"task_metric": f"val/{metric}", "task_base": val[0].value, "task_now": val[-1].value})
    return True, "no task metric to compare against", {}


def _behaviour_alert(name: str, what: Callable[[Shift], str], event_or_events: tuple[str, ...], history: list[Row],
                     groups: Sequence["TrajectoryGroup"], *, step: int, metric: str, higher_is_better: bool,
                     window: int, excess: float, z: float, n: int, collapse_share: float, confidence: float,
                     groups_step: int | None, pick: Callable[[list[Answer], str], list[Answer]]) -> Alert | None:
    """A `warn` when one of the events' shifts fires and the task did not improve; `pick(answers, event)`
    chooses the rollouts quoted as evidence from the step's groups."""
    sign = 1.0 if higher_is_better else -1.0
    fired = []
    for e in event_or_events:
        s = shift(history, e, step=step, window=window)
        paid = paid_for(history, e, step=step, window=window)
        if s is None or not s.fires(excess, z) or paid is None or paid[0] <= 0:
            continue  # no shift, or the reward does not pay for it: not what a hack looks like
        fired.append((s, paid))
    if not fired:
        return None
    s, (paid, task_diff, paid_groups) = max(fired, key=lambda x: x[0].z)
    # Only a behaviour that costs the task warns. One the task is indifferent to (a within-group difference
    # of exactly 0: e.g. every answer already solves it, as a converged run's do) is paid by the reward's
    # own noise half the time; warning on it was most of the false alarms on real clean runs.
    if task_diff is not None and sign * task_diff >= 0:
        return None
    # And only while the run's task is not improving with it: a policy that learns a task of few answers (a
    # 2048 move) says the same short word to every board as its task soars, and a slightly worse task
    # within groups is then the cost of one word over another, not a gamed reward.
    quiet, note, task_ev = task_not_better(history, step=step, metric=metric, higher_is_better=higher_is_better,
                                           window=window, confidence=confidence)
    if not quiet:
        return None
    scored = "" if task_diff is None else f" and scored {task_diff:+.3g} on the task ({metric})"
    task_note = f"within their groups such answers were paid {paid:+.3g} reward{scored} against the others, and {note}"
    task_ev = {**task_ev, "paid": paid, "paid_groups": paid_groups}
    if task_diff is not None:
        task_ev.update(task_metric=metric, task_diff=task_diff)
    answers = answers_of(groups, metric=metric, n=n, collapse_share=collapse_share)
    quoted = pick(answers, s.event)[:3]
    ref = reference(history) or {}
    evidence: dict[str, Any] = {**s.evidence(), **task_ev,
                                "reference": {k.removeprefix(SIGNALS): v for k, v in ref.items() if k.startswith(SIGNALS + "ref_")},
                                "rollouts": [a.quote() for a in quoted]}
    example = _quote_evidence(evidence, quoted, step=step, groups_step=groups_step)
    return Alert(
        name, "warning", step,
        f"{what(s)}: {s.share:.0%} of the last {len(s.steps)} steps' {s.n} answers against {s.base_share:.0%} of "
        f"the base model's own (z {s.z:.1f}), and {task_note}. A reward that pays for this gets gamed: read "
        f"the rollouts it paid for.{example}",
        evidence,
    )


def length_drift(
    history: list[Row], groups: Sequence["TrajectoryGroup"] = (), *, step: int, metric: str = DEFAULT_VAL_METRIC,
    higher_is_better: bool = True, window: int = THRESHOLDS.signal_window, excess: float = THRESHOLDS.shift_excess,
    z: float = THRESHOLDS.shift_z, confidence: float = DEFAULT_CONFIDENCE, groups_step: int | None = None,
) -> Alert | None:
    """Answers longer (or shorter) than 95% of the base model's own, far more often than the base's 5%,
    while the task did not improve: a length bonus, a judge that prefers long (or terse) answers, padding.
    Length that moves while the task improves is the policy learning the task's form, not a hack."""
    def what(s: Shift) -> str:
        ref = reference(history) or {}
        if s.event == "long":
            return f"answers grew longer than the base's 95th percentile ({ref.get(SIGNALS + 'ref_chars_hi')} chars)"
        return f"answers shrank below the base's 5th percentile ({ref.get(SIGNALS + 'ref_chars_lo')} chars)"

    def pick(answers: list[Answer], event: str) -> list[Answer]:
        return sorted(answers, key=lambda a: -a.chars if event == "long" else a.chars)

    return _behaviour_alert("length_drift", what, ("long", "short"), history, groups, step=step, metric=metric,
                            higher_is_better=higher_is_better, window=window, excess=excess, z=z,
                            n=THRESHOLDS.repetition_ngram, collapse_share=THRESHOLDS.collapse_share,
                            confidence=confidence, groups_step=groups_step, pick=pick)


def ngram_repetition(
    history: list[Row], groups: Sequence["TrajectoryGroup"] = (), *, step: int, metric: str = DEFAULT_VAL_METRIC,
    higher_is_better: bool = True, n: int = THRESHOLDS.repetition_ngram, window: int = THRESHOLDS.signal_window,
    excess: float = THRESHOLDS.shift_excess, z: float = THRESHOLDS.shift_z, confidence: float = DEFAULT_CONFIDENCE,
    groups_step: int | None = None,
) -> Alert | None:
    """Answers repeating their word `n`-grams more than 95% of the base model's own do, far more often
    than the base's 5%, while the task did not improve: degenerate repetition, a stuffed key word."""
    def what(s: Shift) -> str:
        return f"degenerate answers: they repeat their {n}-grams more than the base's 95th percentile"

    def pick(answers: list[Answer], event: str) -> list[Answer]:
        return sorted(answers, key=lambda a: -a.repetition)

    return _behaviour_alert("repetition", what, ("repetitive",), history, groups, step=step, metric=metric,
                            higher_is_better=higher_is_better, window=window, excess=excess, z=z, n=n,
                            collapse_share=THRESHOLDS.collapse_share, confidence=confidence,
                            groups_step=groups_step, pick=pick)


def answer_collapse(
    history: list[Row], groups: Sequence["TrajectoryGroup"] = (), *, step: int, metric: str = DEFAULT_VAL_METRIC,
    higher_is_better: bool = True, share: float = THRESHOLDS.collapse_share, window: int = THRESHOLDS.signal_window,
    excess: float = THRESHOLDS.shift_excess, z: float = THRESHOLDS.shift_z, confidence: float = DEFAULT_CONFIDENCE,
    groups_step: int | None = None,
) -> Alert | None:
    """One answer given to many different prompts (at least `share` of a step's groups, and 3), far more
    often than the base model did, while the task did not improve: the policy found an answer the
    reward likes whatever the input. Groups agreeing within themselves is convergence, not this."""
    def what(s: Shift) -> str:
        return "one answer for every input: answers given to several different prompts of a step"

    def pick(answers: list[Answer], event: str) -> list[Answer]:
        shared = [a for a in answers if a.shared]
        if not shared:
            return []
        # the answer given to the most prompts, and its copies and near-copies, one rollout per prompt
        centre = max(shared, key=lambda a: a.shared_prompts)
        ws = answer_words(centre.text)
        like = [a for a in shared if answer_key(a.text) == answer_key(centre.text) or near(ws, answer_words(a.text))]
        firsts = {a.group: a for a in reversed(like)}
        return [firsts[g] for g in sorted(firsts)]

    return _behaviour_alert("answer_collapse", what, ("shared",), history, groups, step=step, metric=metric,
                            higher_is_better=higher_is_better, window=window, excess=excess, z=z,
                            n=THRESHOLDS.repetition_ngram, collapse_share=share, confidence=confidence,
                            groups_step=groups_step, pick=pick)


def _liked_over_task(groups: Sequence["TrajectoryGroup"], metric: str, *, worse: Callable[[float, float], bool],
                     min_distinct: int = 1, limit: int = 3) -> list[Answer]:
    """The rollouts the reward paid above their group's mean while their task was `worse(task, group's
    mean task)`, most overpaid first: the evidence of the reward-and-task alerts. Only groups with
    `min_distinct` or more task values count."""
    by_group: dict[int, list[Answer]] = {}
    for a in answers_of(groups, metric=metric):
        by_group.setdefault(a.group, []).append(a)
    liked: list[tuple[float, Answer]] = []
    for members in by_group.values():
        tasks = [a.task for a in members if a.task is not None]
        if not tasks or len(set(tasks)) < min_distinct:
            continue
        mr, mt = mean([a.reward for a in members]), mean(tasks)
        liked += [(a.reward - mr, a) for a in members if a.task is not None and a.reward > mr and worse(a.task, mt)]
    return [a for _, a in sorted(liked, key=lambda x: -x[0])][:limit]


def _quote_evidence(evidence: dict[str, Any], quoted: Sequence[Answer], *, step: int, groups_step: int | None) -> str:
    """Point `evidence` at the first quoted rollout (its group, the step that sampled it) and return the
    message's example sentence ('' without a quote)."""
    if not quoted:
        return ""
    evidence["group"] = quoted[0].group
    evidence["train_step"] = step if groups_step is None else groups_step
    return f" E.g. {quoted[0].line()}."


def reward_against_task(
    history: list[Row], groups: Sequence["TrajectoryGroup"] = (), *, step: int, metric: str = DEFAULT_VAL_METRIC,
    window: int = THRESHOLDS.against_task_window, z: float = THRESHOLDS.against_task_z, groups_step: int | None = None,
) -> Alert | None:
    """Within the groups of the last `window` steps, reward and the task metric covary negatively beyond
    their noise (a t-statistic over groups at most -`z`): the rollouts the reward preferred, which GRPO
    moves the policy toward, did worse on the task. The steps train against the task, before the task
    metric itself falls. Needs the task metric on the training rollouts (`LoopConfig.score_train`)."""
    sig = _signal_rows(history, step, window, SIGNALS + "cov_groups")
    g = int(sum(r[SIGNALS + "cov_groups"] for r in sig))
    if g < 4:
        return None
    s, q = sum(r[SIGNALS + "cov_sum"] for r in sig), sum(r[SIGNALS + "cov_sq"] for r in sig)
    cov = s / g
    var = max(0.0, (q - s * s / g) / (g - 1))
    t = cov / math.sqrt(var / g) if var > 0 else (-math.inf if cov < 0 else 0.0)
    if cov >= 0 or t > -z:
        return None
    quoted = _liked_over_task(groups, metric, worse=lambda task, mean_task: task < mean_task)
    evidence: dict[str, Any] = {"task_metric": metric, "covariance": cov, "t": t, "groups": g,
                                "steps": [r["step"] for r in sig], "rollouts": [a.quote() for a in quoted]}
    example = _quote_evidence(evidence, quoted, step=step, groups_step=groups_step)
    return Alert(
        "reward_against_task", "critical", step,
        f"reward hacking suspected: within the groups of the last {len(sig)} steps, the rollouts the reward "
        f"preferred scored lower on the task ({metric}; covariance of reward and task {cov:.3g}, t {t:.1f} over "
        f"{g} groups), so each step trains the policy against the task. Read the rollouts the reward liked "
        f"(`groupwise inspect RUN_DIR --split train --best`) and make the reward pay only for what the task "
        f"measures.{example}",
        evidence,
    )


def reward_off_task(
    history: list[Row], groups: Sequence["TrajectoryGroup"] = (), *, step: int, metric: str = DEFAULT_VAL_METRIC,
    higher_is_better: bool = True, window: int = THRESHOLDS.against_task_window, max_r: float = THRESHOLDS.off_task_r,
    confidence: float = DEFAULT_CONFIDENCE, groups_step: int | None = None,
) -> Alert | None:
    """Within the groups of the last `window` steps whose task metric varies, the reward follows the task
    only weakly: their pooled correlation is below `max_r` (at 0.5 the task explains under a quarter of
    the reward's spread there), while the run's task is not improving (`task_not_better`).

    GRPO trains on the order the reward gives a group's rollouts. Where that order is mostly not the
    task's, each update moves the policy toward whatever else the reward pays for: the room a hack grows
    in, visible in the base model's own rollouts, before the policy has found the hack and long before
    validation falls. An honest reward with partial credit or an honest judge's noise orders a group
    much as its task does (a correlation near 1 on every clean run measured); a reward that pays for a
    form, a length or a judge's taste does not. Needs the task metric on the training rollouts
    (`LoopConfig.score_train`). A reward that orders rollouts *against* the task is
    `reward_against_task`'s (a hack); this one is a warning."""
    sig = _signal_rows(history, step, window, SIGNALS + "track_groups")
    g = int(sum(r[SIGNALS + "track_groups"] for r in sig))
    if g < 4:
        return None
    cov, var_r, var_t = (sum(r[SIGNALS + k] for r in sig) for k in ("track_cov", "track_var_reward", "track_var_task"))
    if var_r <= 0 or var_t <= 0:
        return None
    corr = cov / math.sqrt(var_r * var_t)
    if corr >= max_r:
        return None
    quiet, note, task_ev = task_not_better(history, step=step, metric=metric, higher_is_better=higher_is_better,
                                           window=1, confidence=confidence, beyond_noise=True)
    if not quiet:
        return None
    sign = 1.0 if higher_is_better else -1.0
    # the rollouts the reward put above their group without a better task, in the groups whose task varied
    quoted = _liked_over_task(groups, metric, worse=lambda task, mean_task: sign * (task - mean_task) <= 0,
                              min_distinct=2)
    evidence: dict[str, Any] = {**task_ev, "task_metric": metric, "correlation": corr, "groups": g,
                                "steps": [r["step"] for r in sig], "rollouts": [a.quote() for a in quoted]}
    example = _quote_evidence(evidence, quoted, step=step, groups_step=groups_step)
    return Alert(
        "reward_off_task", "warning", step,
        f"the reward barely follows the task: within the {g} groups of the last {len(sig)} steps whose task "
        f"({metric}) varied, reward and task correlate {corr:.2f} (under {max_r:g}), so each step trains the "
        f"policy toward what else the reward pays for, and {note}. Read the rollouts the reward liked "
        f"(`groupwise inspect RUN_DIR --split train --best`) and make it pay for what the task measures, or "
        f"run `groupwise audit` on it.{example}",
        evidence,
    )


# ---------------------------------------------------------------- group-based


def perfect_scores(
    groups: Sequence["TrajectoryGroup"], *, step: int, max_reward: float = THRESHOLDS.perfect_reward,
    share: float = THRESHOLDS.perfect_share, history: list[Row] | None = None, metric: str = DEFAULT_VAL_METRIC,
    higher_is_better: bool = True, confidence: float = DEFAULT_CONFIDENCE,
) -> Alert | None:
    """At least `share` of the groups have every rollout at `max_reward` (seed: "suspiciously perfect"),
    while the task did not improve (`task_not_better`, read from `history` where given): a solved task
    scores perfectly too, and that is no alarm."""
    scored = [g for g in groups if len(g.trajectories) > 0]
    if not scored:
        return None
    perfect = [i for i, g in enumerate(scored) if all(t.reward >= max_reward - 1e-9 for t in g.trajectories)]
    got = len(perfect) / len(scored)
    if got < share:
        return None
    task_note, task_ev = "", {}
    if history is not None:
        quiet, note, task_ev = task_not_better(history, step=step, metric=metric, higher_is_better=higher_is_better,
                                               confidence=confidence)
        if not quiet:
            return None
        task_note = f", and {note}"
    quoted = [a for a in answers_of([scored[i] for i in perfect], metric=metric)][:3]
    quoted = [Answer(perfect[a.group], a.rollout, a.reward, a.text, a.chars, a.repetition, a.task) for a in quoted]
    example = f" E.g. {quoted[0].line()}." if quoted else ""
    return Alert(
        "perfect_scores", "warning", step,
        f"{len(perfect)} of {len(scored)} groups scored {max_reward:g} on every rollout{task_note}. Perfect "
        f"scores the task does not share are suspicious (and give GRPO no signal): check that the reward "
        f"cannot be satisfied trivially.{example}",
        {"n_groups": len(scored), "n_perfect": len(perfect), "share": got, "max_reward": max_reward,
         "perfect_groups": perfect[:10], "group": perfect[0], "rollouts": [a.quote() for a in quoted], **task_ev},
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


def rollout_detectors(history: list[Row], groups: Sequence["TrajectoryGroup"], *, step: int,
                      config: "LoopConfig") -> list[Alert]:
    """The detectors of a step's training rollouts, dated `step`, the policy that sampled `groups`.

    `history` holds the step's train and loop rows already (the loop passes them before it writes them):
    the alerts come before the update on these rollouts, so a hack is told, and can stop the run, before
    the step that would spread it trains, and their lead over a validation that sees the fall is real."""
    c, d = config, config.detectors
    shared = {"metric": c.metric, "higher_is_better": c.higher_is_better, "window": d.signal_window,
              "excess": d.shift_excess, "z": d.shift_z, "confidence": c.confidence, "groups_step": step}
    against = reward_against_task(history, groups, step=step, metric=c.metric, window=d.against_task_window,
                                  z=d.against_task_z, groups_step=step)
    found = [
        against,
        # a reward ordering rollouts against the task also follows it weakly: the hack alert says it all
        None if against else reward_off_task(history, groups, step=step, metric=c.metric,
                                             higher_is_better=c.higher_is_better, window=d.against_task_window,
                                             max_r=d.off_task_r, confidence=c.confidence, groups_step=step),
        answer_collapse(history, groups, share=d.collapse_share, step=step, **shared),
        length_drift(history, groups, step=step, **shared),
        ngram_repetition(history, groups, n=d.repetition_ngram, step=step, **shared),
        perfect_scores(groups, step=step, max_reward=d.perfect_reward, share=d.perfect_share, history=history,
                       metric=c.metric, higher_is_better=c.higher_is_better, confidence=c.confidence),
        identical_answers(groups, step=step, share=d.identical_share),
    ]
    return [a for a in found if a is not None]


def validation_detectors(history: list[Row], *, step: int, config: "LoopConfig",
                         val_groups: Sequence["TrajectoryGroup"] = ()) -> list[Alert]:
    """The detectors of the history's curves (validation against the train reward) at `step`, after its
    validation, and the judge check on judged validation groups (their ``metrics[config.metric]`` is
    ground truth)."""
    c, d = config, config.detectors
    found = [
        val_drop(history, step=step, metric=c.metric, min_drop=d.val_drop, min_rise=d.reward_rise,
                 higher_is_better=c.higher_is_better, window=d.reward_window, confidence=c.confidence),
        val_plateau_reward_rising(history, step=step, metric=c.metric, min_delta=c.min_delta,
                                  min_rise=d.reward_rise, higher_is_better=c.higher_is_better,
                                  window=d.reward_window, confidence=c.confidence),
        reward_jump(history, step=step, window=d.jump_window, min_jump=d.jump_min, sigmas=d.jump_sigmas,
                    plateau_range=d.plateau_range, metric=c.metric, higher_is_better=c.higher_is_better,
                    confidence=c.confidence),
        judge_disagreement(val_groups, step=step, truth_key=c.metric, min_agreement=d.min_judge_agreement)
        if val_groups else None,
    ]
    # A drop (hacking or instability) supersedes val_plateau (a drop is also "no improvement").
    names = {a.name for a in found if a is not None}
    dropped = bool(names & {"val_drop", "val_unstable"})
    return [a for a in found if a is not None and not (a.name == "val_plateau" and dropped)]


def run_detectors(
    history: list[Row], groups: Sequence["TrajectoryGroup"], *, step: int, config: "LoopConfig",
    val_groups: Sequence["TrajectoryGroup"] = (), groups_step: int | None = None,
) -> list[Alert]:
    """Every detector at once, as one step's check: the rollout detectors on `groups` (sampled at
    `groups_step`, default `step`, and dated so) and the validation detectors at `step`. The loop runs the
    two halves at their own moments (`rollout_detectors` before the update, `validation_detectors` after
    the validation); this is for reading a finished history back."""
    gs = step if groups_step is None else groups_step
    return [*rollout_detectors(history, groups, step=gs, config=config),
            *validation_detectors(history, step=step, config=config, val_groups=val_groups)]
