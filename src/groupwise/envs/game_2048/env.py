"""2048 for an LLM agent: the board as text in, one move in a fixed format out.

Each turn the agent sees the board and is asked for one ``<move>DIRECTION</move>`` tag. The reward is
in the spirit of ART's 2048: an invalid move ends the episode with -1; otherwise the log-scaled max tile
(toward `win_tile`) plus 0.2 x the log-scaled board total, and 2 for reaching `win_tile`.

Why the defaults look the way they do (measured, see README): a 135M model on 2 CPU cores gets ~10
minutes of training, ~10-20 GRPO steps, so the learnable signal must exist at step 0. Base
SmolLM2-135M-Instruct, sampled at temperature 1.0, wrote the exact tag in 0 of 32 replies to the
first board (so a strict-format-only reward is all -1: no advantage, nothing to learn), but named
exactly one direction in 11 of 32 with this prompt (4 of 32 with a longer rules-first prompt).
Hence `lenient=True` (default): a reply with no valid tag that names exactly one direction word is
played, but each such move costs `FORMAT_PENALTY` / turns. The reward ladder is then
no move (-1) < a loose move (about -0.25) < a tagged move (about +0.25), and a short game
(`max_turns=4`) keeps episodes cheap. `validate` is the valid-move rate (either format);
``metrics["format_rate"]`` is the strict-tag rate.

One deviation from ART, measured: ART gives a flat -1 whenever an invalid move ends the game. With
base SmolLM2 each reply is a valid move about 30% of the time, so nearly every 4-move game ends
invalid: in 4 groups of 8 rollouts the mean reward was -0.956 and only 1 group had any reward
spread (GRPO learns nothing from a group of equal rewards). So the moves made before the invalid
one earn `PROGRESS_CREDIT` x moves / max_turns on top of the -1 (still below any finished game).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import Field

from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory, split_seeds
from groupwise.envs.game_2048.game import DIRECTIONS, WIN_TILE, Board, Game, board_sum, max_tile, render
from groupwise.core.trajectory import Trajectory

# Short on purpose: with a 135M model, a longer rules-first prompt made well-formed replies rarer.
SYSTEM_PROMPT = "You play the game 2048."
QUESTION = "Which way do you slide the tiles: left, right, up or down? Answer in this format: <move>left</move>"
FORMAT_PENALTY = 0.5  # per loose (untagged) move, averaged over the turns
PROGRESS_CREDIT = 0.5  # an invalid move after k valid ones: -1 + 0.5 * k / max_turns (module doc)

_MOVE_TAG = re.compile(r"<move>\s*([A-Za-z]+)\s*</move>", re.IGNORECASE)
_DIRECTION_WORD = re.compile(r"\b(left|right|up|down)\b", re.IGNORECASE)


class Scenario2048(Sampling):
    """One 2048 game: its seed and its length. The sampling fields come from `Sampling`."""

    seed: int = Field(description="Seeds the spawns: the same seed and moves give the same game.")
    max_turns: int = Field(4, gt=0, description="Most moves the agent makes before the episode stops.")
    lenient: bool = Field(True, description="Play an untagged reply that names exactly one direction "
                          "(with FORMAT_PENALTY); False: only the exact tag counts (ART's rule).")
    win_tile: int = Field(WIN_TILE, ge=4, description="Reaching this tile wins (reward 2).")
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


def parse_move_loose(text: str) -> str | None:
    """The direction of a reply without a valid tag: the one direction word it names (whole word,
    any case), or None when it names none or two different ones ("left or right")."""
    found = {w.lower() for w in _DIRECTION_WORD.findall(text or "")}
    return found.pop() if len(found) == 1 else None


def reward_2048(board: Board, *, invalid: bool, win_tile: int = WIN_TILE) -> float:
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


def user_prompt(board: Board) -> str:
    return f"The board:\n{render(board)}\n{QUESTION}"


def _turn_sampling(scenario: Scenario2048, turn: int) -> Scenario2048:
    """A seeded game draws each reply with its own seed: one seed for every turn would replay the same
    random numbers in each reply, so a game's replies would agree with each other more than chance."""
    if scenario.sampling_seed is None or turn == 0:
        return scenario
    return scenario.model_copy(update={"sampling_seed": scenario.sampling_seed + 7919 * turn})


async def rollout(model: Any, scenario: Scenario2048) -> Trajectory:
    """Play one game; returns the trajectory with reward, metrics and every Choice kept."""
    game = Game(seed=scenario.seed, win_tile=scenario.win_tile)
    traj = new_trajectory(SYSTEM_PROMPT, user_prompt(game.board))
    traj.metadata.update({"env": "2048", "seed": scenario.seed})
    invalid = format_error = illegal = False
    turns = tagged = loose = 0
    while turns < scenario.max_turns and not game.finished:
        if turns:
            traj.messages_and_choices.append({"role": "user", "content": user_prompt(game.board)})
        choice = await complete(model, traj.messages(), _turn_sampling(scenario, turns))
        traj.messages_and_choices.append(choice)
        turns += 1
        text = choice_text(choice)
        direction = parse_move(text)
        tagged += direction is not None
        if direction is None and scenario.lenient:
            direction = parse_move_loose(text)
            loose += direction is not None
        if direction is None:
            invalid = format_error = True
            traj.log(f"turn {turns}: no move in {text[:80]!r}")
            break
        if not game.step(direction):
            invalid = illegal = True
            traj.log(f"turn {turns}: {direction} does not change the board")
            break
    traj.reward = reward_2048(game.board, invalid=invalid, win_tile=scenario.win_tile)
    if invalid:
        traj.reward += PROGRESS_CREDIT * game.moves / scenario.max_turns
    elif turns:  # every turn was a move; the untagged ones cost the format penalty
        traj.reward -= FORMAT_PENALTY * loose / turns
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
            # Replies with the exact <move> tag over moves attempted (the strict format).
            "format_rate": tagged / turns if turns else 0.0,
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
