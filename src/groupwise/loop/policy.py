"""What to do about alerts: the "when metrics diverge" table as the default policy.

| observation           | interpretation  | default action                        | LoopConfig field   |
|-----------------------|-----------------|---------------------------------------|--------------------|
| val up, reward up     | healthy         | continue                              |                    |
| val plateau, reward up| converged       | stop soon (`stop_soon_steps` more)    | `on_val_plateau`   |
| reward up, task down  | reward hacking  | stop now, keep the best checkpoint    | `on_reward_against_task` |
| (within groups)       |                 |                                       |                    |
| reward barely follows| room to hack    | warn                                  | `on_reward_off_task` |
| task (within groups), |                 |                                       |                    |
| task not better       |                 |                                       |                    |
| val down, reward up   | reward hacking  | stop now, keep the best checkpoint    | `on_val_drop`      |
| val down, reward flat | unstable        | stop soon unless validation recovers  | `on_val_unstable`  |
| reward jump           | investigate     | warn                                  | `on_reward_jump`   |
| perfect scores        | investigate     | warn                                  | `on_perfect_scores`|
| behaviour moved, task | investigate     | warn                                  | `on_degenerate`    |
| not better            |                 |                                       |                    |
| judge vs ground truth | judge is off    | warn                                  | `on_judge_disagreement` |

"up" and "down" mean beyond the noise: the validation's confidence interval, the spread of the train
reward's rollouts; a change inside it is no observation at all. Actions, weakest first: ``ignore`` (not recorded), ``warn`` (recorded and reported), ``stop_soon`` (stop
after `stop_soon_steps` more steps unless the validation metric improves meanwhile), ``stop``.
Whatever stops the run, the loop evaluates and keeps the best checkpoint, not the last one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from groupwise.runs.curves import AlertRecord
from groupwise.loop.detectors import Alert, reward_change
from groupwise.runs.series import Row, events, points
from groupwise.loop.stopping import StopDecision, last_improvement, significant_gap

if TYPE_CHECKING:
    from groupwise.config import LoopConfig

ACTION_RANK = {"ignore": 0, "warn": 1, "stop_soon": 2, "stop": 3}

# alert name -> the LoopConfig field holding its action
ACTION_FIELD = {
    "reward_against_task": "on_reward_against_task",
    "reward_off_task": "on_reward_off_task",
    "val_drop": "on_val_drop",
    "val_unstable": "on_val_unstable",
    "val_plateau": "on_val_plateau",
    "reward_jump": "on_reward_jump",
    "perfect_scores": "on_perfect_scores",
    "repetition": "on_degenerate",
    "identical_answers": "on_degenerate",
    "answer_collapse": "on_degenerate",
    "length_drift": "on_degenerate",
    "judge_disagreement": "on_judge_disagreement",
}


def action_for(alert: Alert, config: "LoopConfig") -> str:
    """The configured action of an alert ('warn' for alerts the table does not name)."""
    field_name = ACTION_FIELD.get(alert.name)
    return getattr(config, field_name) if field_name else "warn"


@dataclass(frozen=True)
class PolicyDecision:
    """The strongest action the step's alerts ask for, and the alerts that asked."""

    action: str = "continue"  # "continue", "warn", "stop_soon", "stop"
    alerts: tuple[Alert, ...] = field(default_factory=tuple)
    reason: str = ""


def decide(alerts: Sequence[Alert], config: "LoopConfig") -> PolicyDecision:
    """Combine a step's alerts: the strongest configured action wins; 'ignore' alerts are dropped."""
    kept = [(a, action_for(a, config)) for a in alerts]
    kept = [(a, act) for a, act in kept if act != "ignore"]
    if not kept:
        return PolicyDecision()
    top_alert, top = max(kept, key=lambda x: ACTION_RANK[x[1]])
    return PolicyDecision(top, tuple(a for a, _ in kept), f"{top_alert.name}: {top_alert.message}")


def stop_now(decision: PolicyDecision, step: int) -> StopDecision:
    """A StopDecision for a policy that says 'stop' (rule ``alert:<name>``)."""
    name = decision.reason.split(":", 1)[0]
    return StopDecision(True, f"alert:{name}", decision.reason, step, {"alert": name})


def stop_reason_once(decision: StopDecision) -> str:
    """The stop line's reason: an alert's message was logged when the alert was raised, so a stop by an
    alert names it instead of printing the message a second time."""
    if not decision.rule.startswith("alert:"):
        return decision.reason
    name, evidence = decision.rule.removeprefix("alert:"), decision.evidence or {}
    if "raised_at" in evidence:
        return (f"the {name} alert of step {evidence['raised_at']} (above) asked to stop soon, and validation "
                "has not improved since")
    return f"the {name} alert above"


def pending_stop(history: list[Row], step: int, config: "LoopConfig") -> StopDecision:
    """Stop once a recorded 'stop_soon' alert is `stop_soon_steps` old and validation has not improved
    since it was raised (an improvement cancels it)."""
    alerts = [AlertRecord.from_row(r) for r in events(history, "alert")]
    soon = [a for a in alerts if a.action == "stop_soon" and a.step <= step]
    if not soon:
        return StopDecision(False, step=step)
    val = points(history, "val", config.metric, up_to=step)
    improved_at = last_improvement(val, config.min_delta, config.higher_is_better)[0] if val else -1
    live = [a for a in soon if a.step >= improved_at]
    if not live:
        return StopDecision(False, step=step)
    first = min(live, key=lambda a: a.step)
    if step - first.step < config.stop_soon_steps:
        return StopDecision(False, step=step)
    return StopDecision(
        True, f"alert:{first.name}",
        f"{first.name} at step {first.step} asked to stop soon and validation has not improved in "
        f"the {step - first.step} steps since: {first.message}",
        step, {"alert": first.name, "raised_at": first.step},
    )


def classify(history: list[Row], step: int, config: "LoopConfig") -> str:
    """The table's row for the latest validation against the one before: 'healthy' (validation rose
    beyond its noise), 'hacking' (it fell beyond its noise while the train reward rose beyond its own),
    'unstable' (it fell and the reward did not rise), 'converged' (flat within noise, reward rose), or
    'unknown' (no validation, fewer than two, or flat with a flat reward)."""
    val = points(history, "val", config.metric, up_to=step, confidence=config.confidence)
    if len(val) < 2 or not points(history, "train", "reward", up_to=step):
        return "unknown"
    prev, now = val[-2], val[-1]
    hib, d = config.higher_is_better, config.detectors
    change = reward_change(history, prev.step, step, d.reward_window, config.confidence)
    reward_up = change is not None and change.rose(max(config.min_delta, 1e-12))
    if significant_gap(now, prev, hib, config.min_delta):
        return "healthy"
    if significant_gap(prev, now, hib, d.val_drop):  # a drop larger than val_drop and than the noise
        return "hacking" if change is not None and change.rose(d.reward_rise) else "unstable"
    return "converged" if reward_up else "unknown"
