"""Rollout gathering: many rollouts in flight, an exception budget, a progress bar (no torch here)."""

from groupwise.rollout.gather import exception_budget, gather_trajectories, gather_trajectory_groups

__all__ = ["gather_trajectory_groups", "gather_trajectories", "exception_budget"]
