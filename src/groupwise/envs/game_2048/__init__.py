"""2048: pure rules in `game.py`, the agent glue (prompt, reply format, reward, rollout) in `env.py`."""

from groupwise.envs.game_2048.env import Scenario2048, parse_move, reward_2048, rollout, scenarios, validate

__all__ = ["Scenario2048", "parse_move", "reward_2048", "rollout", "scenarios", "validate"]
