"""One-word answers: the questions (`questions.py`) and the rollout, reward and validation (`env.py`)."""

from groupwise.envs.oneword.env import ScenarioOneWord, reward_of, rollout, scenarios, validate
from groupwise.envs.oneword.questions import QUESTIONS

__all__ = ["QUESTIONS", "ScenarioOneWord", "reward_of", "rollout", "scenarios", "validate"]
