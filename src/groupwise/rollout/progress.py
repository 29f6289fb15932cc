"""The progress bar of a gather: done/total rollouts, running mean reward, exceptions, and the running
means of the trajectories' metrics."""

from __future__ import annotations

import time

from groupwise.core.trajectory import Trajectory

__all__ = ["GatherProgress"]

# The progress bar's postfix (mean reward, exceptions) is re-rendered at most this often: formatting it
# on every rollout would cost more than the rollout bookkeeping itself.
_POSTFIX_INTERVAL_S = 0.2


class GatherProgress:
    """A tqdm bar with done/total, running mean reward, exception count and the running means of the
    trajectories' metrics (the first `max_metrics` of them; None shows all); a no-op when disabled."""

    def __init__(self, desc: str | None, total: int, max_metrics: int | None = None) -> None:
        self.bar = None
        self.reward_sum = 0.0
        self.n_rewards = 0
        self.n_exceptions = 0
        self.max_metrics = max_metrics
        self.metric_sums: dict[str, float] = {}
        self.metric_counts: dict[str, int] = {}
        self._next_postfix = 0.0
        if desc is not None and total > 0:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="rollout", dynamic_ncols=True, leave=True)

    def done(self, trajectories: "list[Trajectory] | None") -> None:
        """One rollout finished with these trajectories (None: it failed)."""
        if trajectories is None:
            self.n_exceptions += 1
        for t in trajectories or ():
            self.reward_sum += t.reward
            self.n_rewards += 1
            if self.bar is not None:
                for name, value in t.metrics.items():
                    self.metric_sums[name] = self.metric_sums.get(name, 0.0) + float(value)
                    self.metric_counts[name] = self.metric_counts.get(name, 0) + 1
        if self.bar is None:
            return
        self.bar.update(1)
        now = time.monotonic()
        if now >= self._next_postfix:
            self._next_postfix = now + _POSTFIX_INTERVAL_S
            self._set_postfix()

    def _set_postfix(self) -> None:
        mean = self.reward_sum / self.n_rewards if self.n_rewards else float("nan")
        postfix = {"reward": f"{mean:.3f}", "exceptions": self.n_exceptions}
        names = list(self.metric_sums)[: self.max_metrics] if self.max_metrics is not None else self.metric_sums
        for name in names:
            postfix[name] = f"{self.metric_sums[name] / self.metric_counts[name]:.3g}"
        self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self._set_postfix()
            self.bar.close()
