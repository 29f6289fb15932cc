"""Math: seeded problems (`problems.py`), the answer grader (`grader.py`), the rollout (`env.py`)."""

from groupwise.envs.math.env import ScenarioMath, rollout, scenarios, validate
from groupwise.envs.math.grader import is_correct, parse_answer
from groupwise.envs.math.problems import Problem, make_problem

__all__ = ["Problem", "ScenarioMath", "is_correct", "make_problem", "parse_answer", "rollout", "scenarios", "validate"]
