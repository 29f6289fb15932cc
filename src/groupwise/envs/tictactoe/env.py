"""Tic-tac-toe for an LLM agent, against a random or a minimax opponent.

Each agent turn shows the board with the free cells numbered 1..9; the reply must name one free cell
as ``<move>5</move>``. Reward (chosen so that every outcome is ordered and a broken reply is the
worst thing the agent can do):

| outcome                                  | reward |
|------------------------------------------|--------|
| win                                      | 1.0    |
| draw                                     | 0.5    |
| loss                                     | 0.0    |
| no/ambiguous move tag, or an occupied cell (the game ends, counted as a loss) | -1.0 + 0.2 x moves made before it |

The credit for moves made before an invalid one (at most 4 x 0.2, so still below a loss) is there
because a flat -1 gave GRPO almost nothing to compare: with base SmolLM2 only 1 of 4 groups of 8
games had any reward spread (the same measurement as in 2048's env.py).

`validate` is the win indicator, so its mean over the held-out games is the win rate against the
random opponent. Against minimax the best an agent can do is a draw.

As in 2048 (see its env.py), base SmolLM2-135M never writes the exact tag at temperature 1.0, so with
`lenient=True` (default) a reply without a valid tag that names exactly one cell number (a standalone
digit 1-9) is played too, each such move costing `FORMAT_PENALTY` / moves on top of the outcome's
reward (not on the -1 of an invalid move). ``metrics["format_rate"]`` is the strict-tag rate.
"""

from __future__ import annotations

import random
import re
from typing import Any, Literal

from pydantic import Field

from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory, split_seeds, turn_sampling
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
from groupwise.core.trajectory import Trajectory

# Short on purpose (a 135M model follows a short question with a format example best).
SYSTEM_PROMPT = "You play tic-tac-toe as {mark}. Three of your marks in a line win."
QUESTION = "Which free cell do you take? Answer in this format: <move>5</move>"
FORMAT_PENALTY = 0.5  # per loose (untagged) move, averaged over the agent's moves

_MOVE_TAG = re.compile(r"<move>\s*(\d+)\s*</move>", re.IGNORECASE)
_CELL_DIGIT = re.compile(r"(?<!\d)(?<!\d\.)([1-9])(?!\d|\.\d)")  # a lone digit, not part of 12 or 3.5

REWARD_WIN, REWARD_DRAW, REWARD_LOSS, REWARD_INVALID = 1.0, 0.5, 0.0, -1.0
PROGRESS_CREDIT = 0.2  # per valid agent move made before an invalid one


class ScenarioTicTacToe(Sampling):
    seed: int = Field(description="Seeds the opponent's choices.")
    opponent: Literal["random", "minimax"] = Field("random", description="Who the agent plays against.")
    agent_mark: Literal["X", "O"] = Field("X", description="The agent's mark; X moves first.")
    max_tokens: int = Field(12, gt=0, description="Most tokens per reply; a move tag is ~5 tokens.")
    lenient: bool = Field(True, description="Play an untagged reply that names exactly one cell number "
                          "(with FORMAT_PENALTY); False: only the exact tag counts.")


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


def parse_cell_loose(text: str) -> int | None:
    """The cell of a reply without a valid tag: the one standalone digit 1-9 it names (repeats of the
    same digit are fine), or None when it names none or two different ones ("12", "3.5" are not cells)."""
    found = set(_CELL_DIGIT.findall(text or ""))
    return int(found.pop()) if len(found) == 1 else None


def user_prompt(board: str, mark: str) -> str:
    return f"The board (you are {mark}, free cells show their number):\n{render(board)}\n{QUESTION}"


def _opponent_move(board: str, opponent: str, rng: random.Random) -> int:
    return random_move(board, rng) if opponent == "random" else minimax_move(board, rng)


async def rollout(model: Any, scenario: ScenarioTicTacToe) -> Trajectory:
    """Play one game; returns the trajectory with reward, metrics and every Choice kept."""
    rng, board, traj = _opening(scenario)
    mark = scenario.agent_mark
    invalid = False
    moves = tagged = loose = 0
    while not is_over(board):
        if moves:
            traj.messages_and_choices.append({"role": "user", "content": user_prompt(board, mark)})
        choice = await complete(model, traj.messages(), turn_sampling(scenario, moves))
        traj.messages_and_choices.append(choice)
        cell = parse_cell(choice_text(choice))
        tagged += cell is not None
        if cell is None and scenario.lenient:
            cell = parse_cell_loose(choice_text(choice))
            loose += cell is not None
        if cell is None or (cell - 1) not in legal_moves(board):
            invalid = True
            traj.log(f"invalid reply {choice_text(choice)[:80]!r} on board {board!r}")
            break
        board = _answered(board, cell, scenario, rng)
        moves += 1
    return _scored(traj, board, mark, invalid=invalid, moves=moves, tagged=tagged, loose=loose)


def demonstration(scenario: ScenarioTicTacToe) -> Trajectory:
    """The game of a scripted agent that plays minimax's move in the exact tag, against the scenario's
    opponent, graded like a rollout: the demonstrations of a supervised warm start (`--sft N`). What it
    teaches first is what an untrained 135M model lacks: one tag naming a free cell, every turn."""
    rng, board, traj = _opening(scenario)  # the opponent's rng, as in the rollout: the same game for the same moves
    own = random.Random(f"demonstrator {scenario.seed}")  # among equally good moves
    mark = scenario.agent_mark
    traj.metadata["policy"] = "scripted"
    moves = 0
    while not is_over(board):
        if moves:
            traj.messages_and_choices.append({"role": "user", "content": user_prompt(board, mark)})
        cell = minimax_move(board, own) + 1
        traj.messages_and_choices.append({"role": "assistant", "content": f"<move>{cell}</move>"})
        board = _answered(board, cell, scenario, rng)
        moves += 1
    return _scored(traj, board, mark, invalid=False, moves=moves, tagged=moves, loose=0)


def _opening(scenario: ScenarioTicTacToe) -> tuple[random.Random, str, Trajectory]:
    """(the opponent's rng, the board the agent first sees, the trajectory up to its first question): the
    opponent moves first when the agent plays O."""
    rng = random.Random(scenario.seed)
    mark = scenario.agent_mark
    board = " " * 9
    if to_move(board) != mark:
        board = play(board, _opponent_move(board, scenario.opponent, rng))
    traj = new_trajectory(SYSTEM_PROMPT.format(mark=mark), user_prompt(board, mark))
    traj.metadata.update({"env": "tictactoe", "seed": scenario.seed, "opponent": scenario.opponent, "mark": mark})
    return rng, board, traj


def _answered(board: str, cell: int, scenario: ScenarioTicTacToe, rng: random.Random) -> str:
    """The board after the agent takes `cell` (1-9, free) and the opponent replies, unless that ended the game."""
    board = play(board, cell - 1)
    return board if is_over(board) else play(board, _opponent_move(board, scenario.opponent, rng))


def _scored(traj: Trajectory, board: str, mark: str, *, invalid: bool, moves: int, tagged: int, loose: int) -> Trajectory:
    """The game's reward and metrics on `traj` (a rollout's or a demonstration's)."""
    won = not invalid and winner(board) == mark
    draw = not invalid and winner(board) is None
    if invalid:
        traj.reward = REWARD_INVALID + PROGRESS_CREDIT * moves
    else:
        traj.reward = REWARD_WIN if won else REWARD_DRAW if draw else REWARD_LOSS
        traj.reward -= FORMAT_PENALTY * loose / max(moves, 1)
    traj.metadata["final_board"] = board
    traj.metrics.update(
        {
            "win": float(won),
            "draw": float(draw),
            "loss": float(not won and not draw),
            "invalid_move": float(invalid),
            "moves": moves,
            "format_rate": tagged / max(len(traj.choices()), moves, 1),
        }
    )
    return traj.finish()


def validate(trajectory: Trajectory) -> float:
    """Held-out metric: 1 for a win, else 0 (the mean is the win rate)."""
    return float(trajectory.metrics["win"])


def validate_not_lost(trajectory: Trajectory) -> float:
    """Held-out metric against minimax: 1 for a win or a draw (a valid game not lost), else 0."""
    return float(trajectory.metrics["win"] or trajectory.metrics["draw"])


def scenarios_minimax(seed: int = 0, **overrides: Any):
    """`scenarios` against the minimax opponent (perfect play: the best the agent can do is a draw)."""
    return scenarios(seed, **{"opponent": "minimax", **overrides})


def scenarios(seed: int = 0, *, n_train: int = 400, n_val: int = 24, n_test: int = 48, **overrides: Any):
    """(train, val, test) games against the random opponent, the agent as X."""
    train, val, test = split_seeds(seed, n_train, n_val, n_test, offset=3)
    make = lambda s, **kw: ScenarioTicTacToe(seed=s, **{**kw, **overrides})  # noqa: E731
    return (
        [make(s) for s in train],
        [make(s, sampling_seed=s) for s in val],
        [make(s, sampling_seed=s) for s in test],
    )
