"""Tic-tac-toe: pure rules and minimax in `game.py`, the agent glue in `env.py`."""

from groupwise.envs.tictactoe.env import ScenarioTicTacToe, parse_cell, rollout, scenarios, validate

__all__ = ["ScenarioTicTacToe", "parse_cell", "rollout", "scenarios", "validate"]
