"""A run folder written step by step through the real run store, as the loop writes it: train groups whose
sampled turns are `Choice`s with token ids, logprobs and grammar-forced indices (as groupwise's server
returns them), a tool call and its result, the judge's explanation in the logs; history rows from
`history_row` with the trainer's metrics; validations with their Wilson interval; a baseline; alerts from
`Alert.to_row`; the stop decision. The browser test writes steps while the page watches; bench/dashboard.py
writes a real-size run with it.

Everything is a function of (step, group, index): two folders written alike are equal.
"""

from __future__ import annotations

from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from groupwise.loop.detectors import Alert
from groupwise.loop.intervals import wilson
from groupwise.runs.store import RunStore, history_row
from groupwise.core.trajectory import Trajectory, TrajectoryGroup

WORDS = ["move", "left", "right", "up", "down", "the", "board", "merge", "tile", "score"]


def reward_of(step: int, group: int, index: int) -> float:
    """Rises with the step; spread within a group (index) so GRPO has a signal."""
    return round(min(1.0, 0.05 * step + 0.1 * index + 0.01 * group), 6)


def choice(step: int, group: int, index: int, n_tokens: int = 6) -> Choice:
    """A sampled assistant turn: a tool call whose JSON braces a grammar forced (indices 0 and n-1)."""
    ids = [100 + (step * 7 + group * 3 + index + k) % 50 for k in range(n_tokens)]
    words = ["{"] + [WORDS[i % len(WORDS)] for i in ids[1:-1]] + ["}"]
    lps = [-0.05 * (k + 1) - 0.1 * index for k in range(n_tokens)]
    return Choice(
        index=0, finish_reason="tool_calls",
        message=ChatCompletionMessage(role="assistant", content=" ".join(words), tool_calls=[{
            "id": f"call_{step}_{group}_{index}", "type": "function",
            "function": {"name": "make_move", "arguments": f'{{"direction": "{words[1]}"}}'}}]),
        logprobs=ChoiceLogprobs(content=[ChatCompletionTokenLogprob(token=w + " ", logprob=lp, bytes=None, top_logprobs=[])
                                         for w, lp in zip(words, lps)]),
        token_ids=ids, forced_token_indices=[0, n_tokens - 1],
    )


def trajectory(step: int, group: int, index: int, split: str = "train", n_tokens: int = 6) -> Trajectory:
    r = reward_of(step, group, index)
    c = choice(step, group, index, n_tokens)
    return Trajectory(
        messages_and_choices=[
            {"role": "system", "content": "You play 2048. Answer with a tool call."},
            {"role": "user", "content": f"board {group}: scenario {group} at step {step}"},
            c,
            {"role": "tool", "tool_call_id": f"call_{step}_{group}_{index}", "content": f"moved; score {int(100 * r)}"},
            {"role": "assistant", "content": f"final answer {index} for scenario {group}"},
        ],
        reward=r, metrics={"correct": float(r >= 0.25), "ruler_score": r},
        metadata={"split": split}, logs=[f"judge: trajectory {index} scored {r:.2f} because it merged tiles"],
    )


def groups_at(step: int, n_groups: int, per_group: int, split: str = "train", n_tokens: int = 6,
              exception_group: int | None = None) -> list[TrajectoryGroup]:
    """The groups of a step; `exception_group`'s has one more rollout, which raised (kept as data)."""
    return [TrajectoryGroup([trajectory(step, g, i, split, n_tokens) for i in range(per_group)], metadata={"scenario_index": g},
                            exceptions=[TimeoutError(f"rollout {per_group} of group {g} timed out")] if g == exception_group else [])
            for g in range(n_groups)]


def write_step(store: RunStore, step: int, *, n_groups: int = 3, per_group: int = 4, val_every: int = 2,
               alert_at: int | None = 2, n_tokens: int = 6, exception_group: int | None = None) -> None:
    """Step `step` as the loop writes it: validation of policy `step` (every `val_every`), then its
    train rollouts, their history row with the trainer's metrics, the loop's timing row, and an alert."""
    if step % val_every == 0:
        val = groups_at(step, n_groups, per_group, "val", n_tokens)
        store.write_trajectories("val", step, val)
        row = history_row(val, step=step, split="val")
        n = sum(len(g.trajectories) for g in val)
        acc = row["correct"]
        row["correct_lo"], row["correct_hi"] = wilson(acc * n, n)
        row["time/val_s"] = 0.5
        store.append_history(row)
        if step == 0:
            store.append_history({**row, "split": "baseline", "name": "base", "kind": "base"})
    train = groups_at(step, n_groups, per_group, n_tokens=n_tokens, exception_group=exception_group)
    store.write_trajectories("train", step, train)
    store.append_history(history_row(train, step=step, split="train", metrics={
        "loss": 0.5 / (step + 1), "policy_loss": 0.4 / (step + 1), "kl": 0.001 * step, "grad_norm": 1.0 + 0.1 * step,
        "trainable_tokens": float(n_groups * per_group * 4), "forced_tokens": float(n_groups * per_group * 2)}))
    store.append_history({"step": step, "split": "loop", "time/gather_s": 1.0 + step, "time/reward_s": 0.1,
                          "time/train_s": 2.0, "judge/cost_usd": 0.001})
    if alert_at is not None and step == alert_at:
        store.append_history(Alert("identical_answers", "warning", step, "every rollout of group 1 answered the same",
                                   {"n_groups": n_groups, "n_identical": 1, "share": 1 / n_groups, "group": 1}).to_row("warn"))


def write_stop(store: RunStore, step: int, best_step: int) -> None:
    store.append_history({"step": step, "split": "stop", "rule": "max_steps", "reason": f"reached max_steps={step}",
                          "best_step": best_step, "best_metric": "val/correct", "evidence": {"max_steps": step}})
