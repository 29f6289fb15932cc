"""2048: merges and scores on hand-worked boards, spawns by seed, the end of a game, the reward,
the reply parser, and one rollout against a scripted endpoint."""

from __future__ import annotations

import random

import pytest

from groupwise.core.choices import choice_logprobs, choice_token_ids
from groupwise.envs.game_2048 import Scenario2048, parse_move, reward_2048, rollout, scenarios, validate
from groupwise.envs.game_2048.env import FORMAT_PENALTY, parse_move_loose
from groupwise.envs.game_2048.game import (
    Game,
    empty_board,
    is_terminal,
    is_valid_move,
    move,
    slide_row_left,
    spawn,
    valid_moves,
)
from groupwise.core.trajectory import Choice


@pytest.mark.parametrize(
    "row, expected, points",
    [
        ((2, 2, 2, 2), (4, 4, 0, 0), 8),      # two pairs: 4 + 4
        ((2, 2, 4, 8), (4, 4, 8, 0), 4),      # the new 4 does not merge again with the old 4
        ((4, 4, 8, 0), (8, 8, 0, 0), 8),      # ...but on the next move it does
        ((2, 0, 0, 2), (4, 0, 0, 0), 4),      # gaps close before merging
        ((8, 8, 8, 0), (16, 8, 0, 0), 16),    # the leftmost pair merges first
        ((4, 4, 4, 4), (8, 8, 0, 0), 16),
        ((2, 4, 2, 4), (2, 4, 2, 4), 0),      # nothing moves
        ((0, 0, 0, 0), (0, 0, 0, 0), 0),
    ],
)
def test_slide_row_left(row, expected, points):
    assert slide_row_left(row) == (expected, points)


BOARD = ((2, 0, 0, 2),
         (0, 4, 4, 0),
         (2, 0, 0, 0),
         (2, 0, 0, 0))


@pytest.mark.parametrize(
    "direction, expected, points",
    [
        ("left", ((4, 0, 0, 0), (8, 0, 0, 0), (2, 0, 0, 0), (2, 0, 0, 0)), 12),   # 2+2 and 4+4
        ("right", ((0, 0, 0, 4), (0, 0, 0, 8), (0, 0, 0, 2), (0, 0, 0, 2)), 12),
        # column 0 is 2,_,2,2 top to bottom: up merges the top two (4, then 2); down the bottom two
        ("up", ((4, 4, 4, 2), (2, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0)), 4),
        ("down", ((0, 0, 0, 0), (0, 0, 0, 0), (2, 0, 0, 0), (4, 4, 4, 2)), 4),
    ],
)
def test_move_in_every_direction(direction, expected, points):
    assert move(BOARD, direction) == (expected, points)


def test_invalid_move_and_unknown_direction():
    board = ((2, 4, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    assert not is_valid_move(board, "left") and not is_valid_move(board, "up")
    assert valid_moves(board) == ["right", "down"]
    with pytest.raises(ValueError, match="unknown direction"):
        move(board, "sideways")


def test_terminal_detection():
    stuck = ((2, 4, 2, 4), (4, 2, 4, 2), (2, 4, 2, 4), (4, 2, 4, 2))
    assert valid_moves(stuck) == [] and is_terminal(stuck)
    full_but_mergeable = ((2, 2, 4, 8), (4, 8, 16, 32), (8, 16, 32, 64), (16, 32, 64, 128))
    assert not is_terminal(full_but_mergeable)
    won = ((2048, 0, 0, 0),) + ((0, 0, 0, 0),) * 3
    assert is_terminal(won, win_tile=2048) and not is_terminal(won, win_tile=4096)


def test_spawn_is_seeded_and_fills_one_empty_cell():
    assert Game(seed=5).board == Game(seed=5).board
    assert len({Game(seed=s).board for s in range(20)}) > 1  # seeds give different starts
    board = spawn(empty_board(), random.Random(0))
    tiles = [v for row in board for v in row if v]
    assert len(tiles) == 1 and tiles[0] in (2, 4)
    full = ((2, 4, 2, 4), (4, 2, 4, 2), (2, 4, 2, 4), (4, 2, 4, 2))
    assert spawn(full, random.Random(0)) == full
    # about one spawn in ten is a 4 (2000 spawns: expect 200, allow a wide band)
    rng = random.Random(1)
    fours = sum(max(max(r) for r in spawn(empty_board(), rng)) == 4 for _ in range(2000))
    assert 140 < fours < 260


def test_game_step_spawns_after_a_valid_move_only():
    game = Game(seed=3)
    start = game.board
    bad = [d for d in ("left", "right", "up", "down") if not is_valid_move(start, d)]
    for d in bad:
        assert game.step(d) is False and game.board == start and game.moves == 0
    d = valid_moves(start)[0]
    assert game.step(d) is True and game.moves == 1
    # the board is the move's result plus exactly one new tile
    moved, _ = move(start, d)
    assert sum(v != 0 for r in game.board for v in r) == sum(v != 0 for r in moved for v in r) + 1


def test_reward_pinned():
    # max 8, sum 16, win 2048: (log2 8 - 1)/(log2 2048 - 1) = 2/10; (log2 16 - 1)/(log2 32768 - 1) = 3/14
    board = ((8, 4, 2, 2), (0,) * 4, (0,) * 4, (0,) * 4)
    assert reward_2048(board, invalid=False) == pytest.approx(0.2 + 0.2 * 3 / 14)  # 0.242857
    # max 4, sum 8: 1/10 + 0.2 * 2/14 = 0.128571
    board = ((4, 2, 2, 0), (0,) * 4, (0,) * 4, (0,) * 4)
    assert reward_2048(board, invalid=False) == pytest.approx(0.1 + 0.2 * 2 / 14)
    assert reward_2048(board, invalid=True) == -1.0
    assert reward_2048(((2048, 0, 0, 0),) + ((0,) * 4,) * 3, invalid=False) == 2.0


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<move>left</move>", "left"),
        ("<move> UP </move>", "up"),
        ("I think right is best. <move>right</move>", "right"),
        ("<MOVE>down</MOVE>", "down"),
        ("left", None),                                   # no tag
        ("<move>left", None),                             # unclosed
        ("<move>north</move>", None),                     # unknown direction
        ("<move>left</move><move>left</move>", None),     # two tags, even agreeing
        ("<move>left</move> or <move>up</move>", None),
        ("", None),
    ],
)
def test_parse_move(reply, expected):
    assert parse_move(reply) == expected


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("The correct move is up.", "up"),
        ("LEFT", "left"),
        ("left, then left again", "left"),               # repeats of one direction are fine
        ("left or right", None),                         # two directions: ambiguous
        ("leftover tiles", None),                        # whole words only
        ("no idea", None),
    ],
)
def test_parse_move_loose(reply, expected):
    assert parse_move_loose(reply) == expected


def _scripted_valid_moves(seed: int, n: int) -> list[str]:
    game, moves = Game(seed=seed), []
    for _ in range(n):
        d = valid_moves(game.board)[0]
        game.step(d)
        moves.append(d)
    return moves


async def test_rollout_against_scripted_endpoint(scripted):
    moves = _scripted_valid_moves(11, 3)
    model = scripted([f"<move>{d}</move>" for d in moves])
    traj = await rollout(model, Scenario2048(seed=11, max_turns=3))
    # the same game replayed by hand gives the reward
    game = Game(seed=11)
    for d in moves:
        game.step(d)
    assert traj.reward == pytest.approx(reward_2048(game.board, invalid=False))
    assert traj.metrics["valid_move_rate"] == 1.0 and traj.metrics["moves"] == 3 and traj.metrics["invalid_move"] == 0.0
    assert validate(traj) == 1.0
    # messages: system, user, then (choice, user) pairs; every Choice kept with its ids and logprobs
    choices = traj.choices()
    assert len(choices) == 3 and all(isinstance(c, Choice) for c in choices)
    assert choice_token_ids(choices[0]) == list(range(100, 100 + len(f"<move>{moves[0]}</move>")))
    assert choice_logprobs(choices[0])[0] == -0.25
    assert [m["role"] for m in traj.messages()] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    first = model.requests[0]
    assert first["model"] == "scripted-agent@0" and first["temperature"] == 1.0
    assert first["max_tokens"] == 16 and first["logprobs"] is True
    assert len(model.requests[2]["messages"]) == 6  # the third request carries the whole game so far


async def test_a_groupwise_client_gets_logprobs_without_asking(scripted):
    """A client that sends groupwise.core.choices.TOKEN_DATA_HEADER (a trainable model's own) gets the logprobs as
    plain lists unasked: the env does not ask, which would have them sent as per-token entries."""
    from groupwise.core.choices import TOKEN_DATA_HEADER

    model = scripted([f"<move>{_scripted_valid_moves(11, 1)[0]}</move>"])
    plain = model.openai_client
    model.openai_client = lambda: plain().with_options(default_headers={TOKEN_DATA_HEADER: "compact"})
    await rollout(model, Scenario2048(seed=11, max_turns=1))
    assert "logprobs" not in model.requests[0] and model.requests[0]["max_tokens"] == 16


async def test_rollout_ends_on_a_malformed_reply(scripted):
    move1 = _scripted_valid_moves(11, 1)[0]
    model = scripted([f"<move>{move1}</move>", "I would go somewhere"])
    traj = await rollout(model, Scenario2048(seed=11, max_turns=4))
    assert traj.reward == -0.875  # -1 + PROGRESS_CREDIT 0.5 x 1 valid move / 4 turns
    assert traj.metrics["format_error"] == 1.0 and traj.metrics["valid_move_rate"] == 0.5  # 1 valid of 2 turns
    assert len(model.requests) == 2 and traj.logs


async def test_lenient_moves_cost_the_format_penalty(scripted):
    moves = _scripted_valid_moves(11, 2)
    model = scripted([f"<move>{moves[0]}</move>", f"I slide {moves[1]}."])
    traj = await rollout(model, Scenario2048(seed=11, max_turns=2))
    game = Game(seed=11)
    for d in moves:
        game.step(d)
    # one untagged move of two turns: game reward - 0.5 * 1/2
    assert traj.reward == pytest.approx(reward_2048(game.board, invalid=False) - FORMAT_PENALTY * 1 / 2)
    assert traj.metrics["valid_move_rate"] == 1.0 and traj.metrics["format_rate"] == 0.5
    strict = scripted([f"<move>{moves[0]}</move>", f"I slide {moves[1]}."])
    traj = await rollout(strict, Scenario2048(seed=11, max_turns=2, lenient=False))
    assert traj.reward == -0.75 and traj.metrics["valid_move_rate"] == 0.5  # -1 + 0.5 x 1 / 2


def test_scenarios_hold_out_the_same_games_for_every_seed():
    train0, val0, test0 = scenarios(0)
    train1, val1, _ = scenarios(1)
    assert [s.seed for s in val0] == [s.seed for s in val1]
    assert {s.seed for s in train0}.isdisjoint({s.seed for s in val0 + test0})
    assert [s.seed for s in train0] != [s.seed for s in train1]
    assert all(s.sampling_seed is None for s in train0) and all(s.sampling_seed is not None for s in val0)
    assert scenarios(0, max_tokens=8)[0][0].max_tokens == 8
