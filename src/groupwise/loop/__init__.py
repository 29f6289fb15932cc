"""The training loop: `fit`, validation, stopping rules, reward-hacking detectors, baselines, reports.

Files, in the order data flows through them::

    fit.py         gw.fit(model, rollout, train, val_scenarios=..., ...) -> FitSummary
    rollout_inputs.py  what a rollout is handed: AtStep (the model at a fixed step), seeded scenarios
    sweep.py       several runs at once: gw.fit([model, ...], config=[...]), gw.fit_runs([gw.FitRun(...)])
    detectors.py   pure functions: history / groups -> Alert | None
    policy.py      alerts -> action (the "when metrics diverge" table)
    stopping.py    pure functions: history -> StopDecision (plateau, target, baseline, max steps)
    intervals.py   how noisy a validation is: Wilson / bootstrap confidence intervals
    series.py      reading curves out of history rows
    baselines.py   scoring prompted models on the validation split (outside fit)
    report.py      `groupwise report RUN_DIR`: PNG plots and a table
    compare.py     `groupwise compare RUN_DIR --steps 0,best`: answers side by side

Nothing here imports torch.
"""

from groupwise.loop.detectors import (
    Alert,
    alert_kind,
    answer_collapse,
    identical_answers,
    judge_disagreement,
    length_drift,
    ngram_repetition,
    perfect_scores,
    reward_against_task,
    reward_jump,
    reward_off_task,
    run_detectors,
    val_drop,
    val_plateau_reward_rising,
)
from groupwise.loop.fit import FitSummary
from groupwise.loop.policy import PolicyDecision, classify, decide
from groupwise.loop.rollout_inputs import AtStep
from groupwise.loop.sweep import FitRun, fit, fit_runs  # fit: one model, or several at once
from groupwise.loop.stopping import (
    StopDecision,
    baseline_beaten,
    check_stopping,
    max_steps_reached,
    plateau,
    target_reached,
)

__all__ = [
    "Alert", "AtStep", "alert_kind", "answer_collapse", "reward_against_task", "FitRun", "FitSummary", "PolicyDecision", "StopDecision", "baseline_beaten", "check_stopping",
    "classify", "decide", "fit", "fit_runs", "identical_answers", "judge_disagreement", "length_drift",
    "max_steps_reached", "ngram_repetition", "perfect_scores", "plateau", "reward_jump", "reward_off_task", "run_detectors",
    "target_reached", "val_drop", "val_plateau_reward_rising",
]
