"""Tic-tac-toe for an LLM agent, against a random or a minimax opponent.

Each agent turn shows the board with the free cells numbered 1..9; the reply must name one free cell
as ``<move>5</move>``. Reward (chosen so that every outcome is ordered and a broken reply is the
worst thing the agent can do):

| outcome                                  | reward |
|------------------------------------------|--------|
| win                                      | 1.0    |
| draw                                     | 0.5    |
| loss                                     | 0.0    |
| no/ambiguous move tag, or an occupied cell (the game ends, counted as a loss) | -1.0 |

`validate` is the win indicator, so its mean over the held-out games is the win rate against the
random opponent. Against minimax the best an agent can do is a draw.
"""

from __future__ import annotations

import random
import re
from typing import Any, Literal

from pydantic import Field

from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory, split_seeds
from groupwise.envs.tictactoe.game import (
    is_over,
    legal_moves,
    minimax_move,
    play,
    random_move,
    render,
    to_move,
    winner,
)
from groupwise.types import Trajectory

SYSTEM_PROMPT = (
    "You are playing tic-tac-toe as {mark}. The board shows each free cell as its number 1-9. "
    "Three of your marks in a row, column or diagonal win. Answer with exactly one free cell in this "
    "format and nothing else: <move>5</move>"
)

_MOVE_TAG = re.compile(r"<move>\s*(\d+)\s*</move>", re.IGNORECASE)

REWARD_WIN, REWARD_DRAW, REWARD_LOSS, REWARD_INVALID = 1.0, 0.5, 0.0, -1.0


class ScenarioTicTacToe(Sampling):
    seed: int = Field(description="Seeds the opponent's choices.")
    opponent: Literal["random", "minimax"] = Field("random", description="Who the agent plays against.")
    agent_mark: Literal["X", "O"] = Field("X", description="The agent's mark; X moves first.")
    max_tokens: int = Field(12, gt=0, description="Most tokens per reply; a move tag is ~5 tokens.")


def parse_cell(text: str) -> int | None:
    """The cell (1..9) a reply names, or None when it is not exactly one ``<move>N</move>`` with N in 1..9.

    Accepted: one tag anywhere in the text, spaces inside it. Rejected: no tag, two or more tags,
    a number outside 1..9, anything but digits inside the tag (``<move>B2</move>``).
    Whether the cell is free is the game's business, not the parser's.
    """
    tags = _MOVE_TAG.findall(text or "")
    if len(tags) != 1:
        return None
    cell = int(tags[0])
    return cell if 1 <= cell <= 9 else None


def user_prompt(board: str, mark: str) -> str:
    return f"The board (you are {mark}):\n{render(board)}\nYour move?"


def _opponent_move(board: str, opponent: str, rng: random.Random) -> int:
    return random_move(board, rng) if opponent == "random" else minimax_move(board, rng)


async def rollout(model: Any, scenario: ScenarioTicTacToe) -> Trajectory:
    """Play one game; returns the trajectory with reward, metrics and every Choice kept."""
    rng = random.Random(scenario.seed)
    mark = scenario.agent_mark
    board = " " * 9
    if to_move(board) != mark:
        board = play(board, _opponent_move(board, scenario.opponent, rng))
    traj = new_trajectory(SYSTEM_PROMPT.format(mark=mark), user_prompt(board, mark))
    traj.metadata.update({"env": "tictactoe", "seed": scenario.seed, "opponent": scenario.opponent, "mark": mark})
    invalid = False
    moves = 0
    while not is_over(board):
        if moves:
            traj.messages_and_choices.append({"role": "user", "content": user_prompt(board, mark)})
        choice = await complete(model, traj.messages(), scenario)
        traj.messages_and_choices.append(choice)
        cell = parse_cell(choice_text(choice))
        if cell is None or (cell - 1) not in legal_moves(board):
            invalid = True
            traj.log(f"invalid reply {choice_text(choice)[:80]!r} on board {board!r}")
            break
        board = play(board, cell - 1)
        moves += 1
        if not is_over(board):
            board = play(board, _opponent_move(board, scenario.opponent, rng))
    won = not invalid and winner(board) == mark
    draw = not invalid and winner(board) is None
    if invalid:
        traj.reward = REWARD_INVALID
    else:
        traj.reward = REWARD_WIN if won else REWARD_DRAW if draw else REWARD_LOSS
    traj.metadata["final_board"] = board
    traj.metrics.update(
        {
            "win": float(won),
            "draw": float(draw),
            "loss": float(not won and not draw),
            "invalid_move": float(invalid),
            "moves": moves,
        }
    )
    return traj.finish()


def validate(trajectory: Trajectory) -> float:
    """Held-out metric: 1 for a win, else 0 (the mean is the win rate)."""
    return float(trajectory.metrics["win"])


def scenarios(seed: int = 0, *, n_train: int = 400, n_val: int = 24, n_test: int = 48, **overrides: Any):
    """(train, val, test) games against the random opponent, the agent as X."""
    train, val, test = split_seeds(seed, n_train, n_val, n_test, offset=3)
    make = lambda s, **kw: ScenarioTicTacToe(seed=s, **{**kw, **overrides})  # noqa: E731
    return (
        [make(s) for s in train],
        [make(s, sampling_seed=s) for s in val],
        [make(s, sampling_seed=s) for s in test],
    )
