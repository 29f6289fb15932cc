"""The email agent (ART-E-like): synthetic inboxes in SQLite/FTS5 (`inbox.py`), tools (`tools.py`),
questions and grading (`questions.py`), the multi-turn tool-using rollout (`env.py`), and a scripted agent
that knows the ground truth, whose trajectories are SFT demonstrations (`scripted.py`)."""

from groupwise.envs.email_search.env import ScenarioEmail, email_reward, rollout, scenarios, validate
from groupwise.envs.email_search.questions import is_correct
from groupwise.envs.email_search.scripted import demonstration, demonstrations

__all__ = ["ScenarioEmail", "demonstration", "demonstrations", "email_reward", "is_correct", "rollout", "scenarios",
           "validate"]
