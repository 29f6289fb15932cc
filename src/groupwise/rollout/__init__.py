"""Rollout gathering: many rollouts in flight, an exception budget, a progress bar (no torch here)."""

from groupwise.rollout.gather import exception_budget, gather_trajectories, gather_trajectory_groups
from groupwise.rollout.hangs import HangReport, note_progress

__all__ = ["gather_trajectory_groups", "gather_trajectories", "exception_budget", "HangReport", "note_progress"]
