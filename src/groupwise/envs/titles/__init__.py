"""Titles: a subjective writing task scored only by the RULER judge (`env.RUBRIC`)."""

from groupwise.envs.titles.env import RUBRIC, ScenarioTitle, extract_title, rollout, scenarios, validate

__all__ = ["RUBRIC", "ScenarioTitle", "extract_title", "rollout", "scenarios", "validate"]
