"""One line per training step, for a person watching a run (logged by `fit` at INFO on ``groupwise.loop``).

    step 3/8 · reward -0.891 ± 0.050 · valid_move_rate 0.23 · rollouts 25s, judge 0s, update 41s · ETA 4m10s
    step 4/8 · reward -0.802 ± 0.061 · ... · val valid_move_rate 0.469 [0.330, 0.608] (best 0.469 @4) · ETA 3m05s

The train numbers are those of the rollouts the step trained on (sampled by the policy of the step
before), the ± is the 95% noise of their mean (1.96 x std / sqrt(n)), and the validation, when this step
had one, carries its confidence interval. The ETA extrapolates the mean wall time of the steps done so
far (validations included) to `max_steps`, plus the final test; without `max_steps` there is none.
`groupwise train` shows these lines; a library user sees them with
``logging.getLogger("groupwise.loop").setLevel(logging.INFO)`` and a handler.
"""

from __future__ import annotations

import math

from groupwise.runs.series import Row, rows, value

__all__ = ["duration", "eta_seconds", "step_line"]


def duration(seconds: float) -> str:
    """'42s', '4m10s', '1h02m'."""
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def eta_seconds(*, step: int, start_step: int, max_steps: int | None, elapsed_s: float,
                test_s: float = 0.0) -> float | None:
    """Seconds left: the mean time of the steps this call made, times the steps left, plus the test."""
    done = step - start_step
    if max_steps is None or done <= 0:
        return None
    return elapsed_s / done * max(0, max_steps - step) + test_s


def _row_at(history: list[Row], split: str, step: int) -> Row | None:
    for row in rows(history, split):
        if row["step"] == step:
            return row
    return None


def step_line(history: list[Row], step: int, *, metric: str, max_steps: int | None, eta_s: float | None,
              best: tuple[int | None, float | None] = (None, None)) -> str:
    """The line of training step `step` (the one that produced policy `step`)."""
    parts = [f"step {step}/{max_steps}" if max_steps is not None else f"step {step}"]
    train = _row_at(history, "train", step - 1)
    if train is not None:
        r, sd, n = (value(train, "train", k) for k in ("reward", "reward_std", "n_trajectories"))
        noise = f" ± {1.96 * sd / math.sqrt(n):.3f}" if sd is not None and n else ""
        parts.append(f"reward {r:.3f}{noise}" if r is not None else "reward -")
        m = value(train, "train", metric)
        if m is not None:
            parts.append(f"{metric} {m:.3f}")
    loop = _row_at(history, "loop", step - 1)
    if loop is not None:
        secs = [value(loop, "loop", k) or 0.0 for k in ("time/gather_s", "time/reward_s", "time/train_s")]
        parts.append(f"rollouts {duration(secs[0])}, judge {duration(secs[1])}, update {duration(secs[2])}")
    val = _row_at(history, "val", step)
    v = value(val, "val", metric) if val is not None else None
    if v is not None:
        lo, hi = value(val, "val", f"{metric}_lo"), value(val, "val", f"{metric}_hi")
        ci = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
        best_step, best_v = best
        tail = f" (best {best_v:.3f} @{best_step})" if best_v is not None else ""
        parts.append(f"val {metric} {v:.3f}{ci}{tail}")
    if eta_s is not None:
        parts.append(f"ETA {duration(eta_s)}")
    return " · ".join(parts)
