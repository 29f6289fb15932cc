"""Tic-tac-toe: pure rules and minimax in `game.py`, the agent glue in `env.py`."""

from groupwise.envs.tictactoe.env import (
    ScenarioTicTacToe,
    demonstration,
    parse_cell,
    rollout,
    scenarios,
    scenarios_minimax,
    validate,
    validate_not_lost,
)

__all__ = ["ScenarioTicTacToe", "demonstration", "parse_cell", "rollout", "scenarios", "scenarios_minimax", "validate",
           "validate_not_lost"]
