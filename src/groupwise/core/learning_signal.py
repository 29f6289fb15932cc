"""Whether a step's groups carry a learning signal, and what to do with a step that has none.

GRPO learns from differences within a group: a group whose rewards all tie has every advantage 0. A
step where every group ties teaches nothing, and it means one of two opposite things:

- **solved**: every group ties at the top. The policy answers every scenario as well as the reward can
  tell; the run is done and should stop as a success, keeping its best checkpoint.
- **stuck**: the groups tie below the top (or at values that say nothing about the top). More
  rollouts, a graded reward or a judge are needed; as in ART the step is skipped, and a run that keeps
  having no signal fails loudly (`TrainConfig.max_skipped_steps`).

The reward's maximum is not declared anywhere, so "the top" is read from the run: a tie is at the top
when every group ties at one value that is the highest reward any rollout of the run has scored, and
some rollout scored lower (a run that only ever saw one value has learnt nothing that says where the top
is); or when the latest validation of a `validate` metric (ground truth, bounded by 1) scored 1.0.

This module is the one home of that policy: `assess` gives the verdict as a value, `loop_action` says
what `gw.fit` does with it (resample, stop as converged, or train), `skip_action` what a backend's
`train` does (train, skip as ART does, or raise), and `step_verdict` is that decision as a value with
the sentence that explains it (the backend acts on it: no policy or wording of its own). Pure Python,
so the loop, the backends and the trainer read the same rule and the same tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Rewards closer than this are "equal": float noise from a judge must not create a fake signal.
ZERO_VARIANCE_TOL = 1e-9


def tied(rewards_G: Sequence[float]) -> bool:
    """Whether a group's rewards are all equal (an empty group carries no signal either)."""
    return not rewards_G or max(rewards_G) - min(rewards_G) <= ZERO_VARIANCE_TOL


@dataclass(frozen=True)
class Signal:
    """The verdict on one step's groups: ``kind`` is 'trainable', 'solved', 'stuck' or 'empty'."""

    kind: str
    reason: str  # a sentence naming the groups' rewards (empty when trainable)
    rewards: tuple[tuple[float, ...], ...] = ()

    @property
    def trainable(self) -> bool:
        return self.kind == "trainable"


def describe(rewards: Sequence[Sequence[float]], shown: int = 6) -> str:
    """The groups' rewards, as the warnings and errors print them."""
    if not rewards:
        return "no groups were given (did fit's score_group drop every group?)"
    parts = "; ".join(f"group {g}: {list(r[:shown])}{' ...' if len(r) > shown else ''}"
                      for g, r in enumerate(rewards[:shown]))
    return (f"in every one of the {len(rewards)} group(s) all rewards are equal "
            f"({parts}{'; ...' if len(rewards) > shown else ''}), so every group-relative advantage is 0")


def assess(rewards: Sequence[Sequence[float]], *, reward_range: tuple[float, float] | None = None,
           val_at_ceiling: bool = False) -> Signal:
    """The verdict on a step whose group g has rewards ``rewards[g]``.

    reward_range: (lowest, highest) reward any rollout of the run has scored, this step's included;
    val_at_ceiling: the latest validation is at its maximum (module doc). Without either, a step
    without signal is 'stuck': nothing says its tie is at the top."""
    rewards = tuple(tuple(float(r) for r in group) for group in rewards)
    if not rewards or not any(rewards):
        return Signal("empty", "no learning signal: " + describe(rewards), rewards)
    if not all(tied(r) for r in rewards):
        return Signal("trainable", "", rewards)
    values = [r[0] for r in rewards if r]
    one_value = max(values) - min(values) <= ZERO_VARIANCE_TOL
    at_top = (one_value and reward_range is not None and values[0] >= reward_range[1] - ZERO_VARIANCE_TOL
              and reward_range[0] < values[0] - ZERO_VARIANCE_TOL)
    if one_value and (at_top or val_at_ceiling):
        why = (f"the highest reward of the run (it has scored as low as {reward_range[0]:g})" if at_top
               else "while the latest validation is at its ceiling (1.0)")
        return Signal("solved", f"solved: every rollout of every group scored {values[0]:g}, {why}", rewards)
    return Signal("stuck", "no learning signal: " + describe(rewards), rewards)


def loop_action(signal: Signal, attempt: int, resamples: int) -> str:
    """What `gw.fit` does with a gathered step: 'train', 'resample' (gather the same scenarios again;
    `attempt` counts from 0, `resamples` is `LoopConfig.resample_no_signal`) or 'converged' (stop: the
    task is solved, as far as the run can tell). A stuck step is trained after its resamples: the
    backend skips it as ART does, and raises once `TrainConfig.max_skipped_steps` are used up."""
    if signal.trainable:
        return "train"
    if attempt < resamples:
        return "resample"
    return "converged" if signal.kind == "solved" else "train"


def skip_action(signal: Signal, skipped_in_a_row: int, max_skipped_steps: int) -> str:
    """What a backend's `train` does with a step: 'train', 'skip' (no gradient step, the unchanged
    adapter becomes the next step, as ART does) or 'raise' (NotTrainableError: `max_skipped_steps`
    steps in a row were skipped already)."""
    if signal.trainable:
        return "train"
    return "raise" if skipped_in_a_row >= max_skipped_steps else "skip"


FIX = ("Make rewards differ within a group: more rollouts per group, a graded reward instead of pass/fail, "
       "harder or easier scenarios, or a judge (RULER).")


@dataclass(frozen=True)
class StepVerdict:
    """What a backend's `train` does with one step (`step_verdict`)."""

    action: str  # 'train', 'skip' or 'raise' (`skip_action`)
    message: str = ""  # the warning of a skip, the error of a raise
    skipped_in_a_row: int = 0  # consecutive skipped steps once this step is done
    evidence: dict[str, Any] = field(default_factory=dict)

    def alert_row(self, step: int) -> dict[str, Any]:
        """The history row that records a skipped step (split ``alert``, name ``no_signal``)."""
        return {"step": step, "split": "alert", "name": "no_signal", "severity": "warning", "message": self.message,
                "action": "skip", "evidence": self.evidence}


def step_verdict(rewards: Sequence[Sequence[float]], *, step: int, skipped_in_a_row: int,
                 max_skipped_steps: int) -> StepVerdict:
    """The backend's decision on step `step`, whose group g has rewards ``rewards[g]``, after
    `skipped_in_a_row` skipped steps (`TrainConfig.max_skipped_steps` bounds them)."""
    action = skip_action(assess(rewards), skipped_in_a_row, max_skipped_steps)
    if action == "train":
        return StepVerdict("train")
    why = f"no learning signal: {describe(rewards)}"
    if action == "raise":
        return StepVerdict("raise", f"step {step}: {why}. {skipped_in_a_row} step(s) in a row were already skipped "
                           f"for this and TrainConfig.max_skipped_steps={max_skipped_steps} allows no more. {FIX}",
                           skipped_in_a_row)
    n = skipped_in_a_row + 1
    message = (f"step {step} skipped: {why}. No gradient step was taken; the adapter of step {step} is served "
               f"unchanged as step {step + 1}. {n} of at most {max_skipped_steps} consecutive skipped step(s) "
               f"(TrainConfig.max_skipped_steps). {FIX}")
    return StepVerdict("skip", message, n, {"rewards": [list(r[:8]) for r in rewards[:8]], "skipped_in_a_row": n})
