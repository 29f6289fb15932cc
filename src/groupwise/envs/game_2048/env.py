"""2048 for an LLM agent: the board as text in, one move in a fixed format out.

Each turn the agent sees the board and must answer with exactly one ``<move>DIRECTION</move>`` tag.
A reply that names no move (or several), or names a move that does not change the board, is an
invalid move: the episode ends there with reward -1 (ART's 2048 rule). Otherwise the reward is
log-scaled: how far the max tile got toward `win_tile`, plus 0.2 x how far the board's total got,
and 2 for reaching `win_tile`.

Why the default game is short (`max_turns=4`): a 135M model on 2 CPU cores gets ~10 minutes of
training, ~10-20 GRPO steps. In that budget it will not learn strategy, but it can learn to answer in
the exact format with a move that is legal; the -1 against ~+0.2..0.3 gap makes that the dominant
signal, and `valid_move_rate` on held-out seeds (`validate`) measures it.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import Field

from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory, split_seeds
from groupwise.envs.game_2048.game import DIRECTIONS, Board, Game, board_sum, max_tile, render
from groupwise.types import Trajectory

SYSTEM_PROMPT = (
    "You are playing 2048. Tiles slide in the direction you choose; two equal tiles that touch merge "
    "into one. Empty cells are shown as _. A move must change the board. "
    "Answer with exactly one move in this format and nothing else: <move>left</move> "
    "(the other moves are <move>right</move>, <move>up</move>, <move>down</move>)."
)

_MOVE_TAG = re.compile(r"<move>\s*([A-Za-z]+)\s*</move>", re.IGNORECASE)


class Scenario2048(Sampling):
    """One 2048 game: its seed and its length. The sampling fields come from `Sampling`."""

    seed: int = Field(description="Seeds the spawns: the same seed and moves give the same game.")
    max_turns: int = Field(4, gt=0, description="Most moves the agent makes before the episode stops.")
    win_tile: int = Field(2048, ge=4, description="Reaching this tile wins (reward 2).")
    max_tokens: int = Field(16, gt=0, description="Most tokens per reply; a move tag is ~6 tokens.")


def parse_move(text: str) -> str | None:
    """The direction named by a reply, or None when the reply is not exactly one valid move tag.

    Accepted: one ``<move>left</move>`` tag anywhere in the text, any letter case, spaces inside the
    tag. Rejected: no tag, an unclosed tag, an unknown direction, or two or more tags (ambiguous,
    even when they agree: the format asks for exactly one).
    """
    tags = _MOVE_TAG.findall(text or "")
    if len(tags) != 1:
        return None
    direction = tags[0].lower()
    return direction if direction in DIRECTIONS else None


def reward_2048(board: Board, *, invalid: bool, win_tile: int = 2048) -> float:
    """ART-style reward: -1 for an invalid move, 2 for a win, else max-tile score + 0.2 x board score.

    max-tile score = (log2(max tile) - 1) / (log2(win_tile) - 1): a lone 2 gives 0, win_tile gives 1.
    board score = (log2(sum of tiles) - 1) / (log2(16 x win_tile) - 1): the board full of win tiles gives 1.
    """
    if invalid:
        return -1.0
    top = max_tile(board)
    if top >= win_tile:
        return 2.0
    top_score = (math.log2(top) - 1) / (math.log2(win_tile) - 1)
    sum_score = (math.log2(board_sum(board)) - 1) / (math.log2(16 * win_tile) - 1)
    return top_score + 0.2 * sum_score


def user_prompt(board: Board, turn: int, max_turns: int) -> str:
    return f"Move {turn} of {max_turns}. The board:\n{render(board)}\nYour move?"


async def rollout(model: Any, scenario: Scenario2048) -> Trajectory:
    """Play one game; returns the trajectory with reward, metrics and every Choice kept."""
    game = Game(seed=scenario.seed, win_tile=scenario.win_tile)
    traj = new_trajectory(SYSTEM_PROMPT, user_prompt(game.board, 1, scenario.max_turns))
    traj.metadata.update({"env": "2048", "seed": scenario.seed})
    invalid = format_error = illegal = False
    turns = 0
    while turns < scenario.max_turns and not game.finished:
        if turns:
            traj.messages_and_choices.append(
                {"role": "user", "content": user_prompt(game.board, turns + 1, scenario.max_turns)}
            )
        choice = await complete(model, traj.messages(), scenario)
        traj.messages_and_choices.append(choice)
        turns += 1
        direction = parse_move(choice_text(choice))
        if direction is None:
            invalid = format_error = True
            traj.log(f"turn {turns}: no valid <move> tag in {choice_text(choice)[:80]!r}")
            break
        if not game.step(direction):
            invalid = illegal = True
            traj.log(f"turn {turns}: {direction} does not change the board")
            break
    traj.reward = reward_2048(game.board, invalid=invalid, win_tile=scenario.win_tile)
    traj.metrics.update(
        {
            "max_tile": max_tile(game.board),
            "board_sum": board_sum(game.board),
            "moves": game.moves,
            "turns": turns,
            "invalid_move": float(invalid),
            "format_error": float(format_error),
            "illegal_move": float(illegal),
            # Valid moves over moves attempted: 0 when the first reply is invalid, 1 when none is.
            "valid_move_rate": game.moves / turns if turns else 0.0,
            "win": float(game.won),
        }
    )
    return traj.finish()


def validate(trajectory: Trajectory) -> float:
    """Held-out metric: the valid-move rate of the game (higher is better)."""
    return float(trajectory.metrics["valid_move_rate"])


def scenarios(seed: int = 0, *, n_train: int = 400, n_val: int = 24, n_test: int = 48, **overrides: Any):
    """(train, val, test) games. Val/test seeds are the same for every run seed (see `split_seeds`)."""
    train, val, test = split_seeds(seed, n_train, n_val, n_test, offset=2048)
    make = lambda s, **kw: Scenario2048(seed=s, **{**kw, **overrides})  # noqa: E731
    return (
        [make(s) for s in train],
        [make(s, sampling_seed=s) for s in val],
        [make(s, sampling_seed=s) for s in test],
    )
