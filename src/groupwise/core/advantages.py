"""Group-relative advantages (GRPO): each rollout is scored against the other rollouts of its group.

    A_i = r_i - mean_j(r_j)                       (Dr. GRPO, scale_rewards=False)
    A_i = (r_i - mean_j(r_j)) / (std_j(r_j) + eps) (GRPO, scale_rewards=True)

std is the population std (divide by N, not N - 1): a group of two rewards {0, 1} gets advantages
{-1, +1}, which reads naturally; TRL uses the sample std, which would give {-0.71, +0.71}.

A group whose rewards are all equal carries no learning signal (every advantage is 0): it is skipped
and counted, so the caller can report `zero_variance_fraction` (a rising fraction means the task got
too easy or too hard, or the judge collapsed). Pure Python: no torch, so the client side can use it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from groupwise.errors import InvalidDataError
from groupwise.core.learning_signal import tied


@dataclass
class GroupAdvantages:
    """Advantages of every group of a step; None marks a skipped (zero-variance) group."""

    advantages: list[list[float] | None] = field(default_factory=list)  # [num_groups][G]

    @property
    def num_groups(self) -> int:
        return len(self.advantages)

    @property
    def zero_variance_groups(self) -> int:
        return sum(1 for a in self.advantages if a is None)

    @property
    def zero_variance_fraction(self) -> float:
        return self.zero_variance_groups / self.num_groups if self.num_groups else 0.0


# Rewards above this in size are scaled down first: n of them, squared and summed, would overflow a
# float (to inf, and the advantages to nan or to zeros: a group's signal lost without a word).
_LARGE_REWARD = 1e150


def group_advantages(rewards_G: Sequence[float], *, scale: bool = True, eps: float = 1e-6) -> list[float] | None:
    """Advantages of one group, or None when the group has zero reward variance (nothing to learn)."""
    if not rewards_G or tied(rewards_G):  # the same tolerance as the loop's and the backend's no-signal rule
        return None
    peak = max(abs(r) for r in rewards_G)
    if peak <= _LARGE_REWARD:
        return _advantages(rewards_G, scale, eps)
    # Dividing by a power of two is exact: (r - mean) / (std + eps) is the same function of r / unit with
    # eps / unit; without `scale` the centred rewards are scaled back (inf only where they truly exceed
    # a float, which the step's finite-loss check then reports).
    e = math.frexp(peak)[1]  # peak < 2**e; up to 2**1024, which is itself past a float: ldexp, not 2.0**e
    scaled_G = _advantages([math.ldexp(r, -e) for r in rewards_G], scale, math.ldexp(eps, -e))
    return scaled_G if scale else [a * 2.0 ** (e - 1) * 2.0 for a in scaled_G]


def _advantages(rewards_G: Sequence[float], scale: bool, eps: float) -> list[float]:
    n = len(rewards_G)
    mean = sum(rewards_G) / n
    centred_G = [r - mean for r in rewards_G]
    if not scale:
        return centred_G
    std = math.sqrt(sum(c * c for c in centred_G) / n)
    return [c / (std + eps) for c in centred_G]


# The largest advantage the trainer takes. Scaled advantages are at most sqrt(G - 1) in size; unscaled
# ones (r - mean) are as large as the rewards' spread, and the loss multiplies them by a ratio of up to
# e^20 (training/loss.py's LOG_RATIO_LIMIT) and sums them over a step's tokens in float32 (at most
# 3.4e38): 1e12 keeps that sum finite for any step that fits a device, and is far past any reward scale
# worth training on (rescale such rewards; the group-relative signal is the same).
ADVANTAGE_LIMIT = 1e12


def compute_advantages(rewards: Sequence[Sequence[float]], *, scale: bool = True) -> GroupAdvantages:
    """Advantages of every group (`rewards[g][i]` is rollout i of group g). An advantage past
    `ADVANTAGE_LIMIT` (a reward spread the loss cannot multiply without overflowing) is an
    `InvalidDataError` naming its group and trajectory, raised before anything is trained."""
    out = GroupAdvantages([group_advantages(r, scale=scale) for r in rewards])
    for g, adv_G in enumerate(out.advantages):
        for i, a in enumerate(adv_G or ()):
            if not abs(a) <= ADVANTAGE_LIMIT:
                raise InvalidDataError(
                    f"group {g}, trajectory {i}: its advantage is {a:.3g} (rewards {min(rewards[g]):.3g} to "
                    f"{max(rewards[g]):.3g}, scale_rewards={scale}); the loss takes advantages up to "
                    f"{ADVANTAGE_LIMIT:.0e} in size, past which its products overflow. Rescale the rewards "
                    "(the group-relative signal is the same) or train with scale_rewards=True.")
    return out
