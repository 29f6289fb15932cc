"""The email agent (ART-E-like): synthetic inboxes in SQLite/FTS5 (`inbox.py`), tools (`tools.py`),
questions and grading (`questions.py`), the multi-turn tool-using rollout (`env.py`)."""

from groupwise.envs.email_search.env import ScenarioEmail, email_reward, rollout, scenarios, validate
from groupwise.envs.email_search.questions import is_correct

__all__ = ["ScenarioEmail", "email_reward", "is_correct", "rollout", "scenarios", "validate"]
