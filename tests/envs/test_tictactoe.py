"""Tic-tac-toe: rules, minimax never loses (exhaustively), the reply parser, one scripted rollout."""

from __future__ import annotations

import random

import pytest

from groupwise.envs.tictactoe import ScenarioTicTacToe, parse_cell, rollout, validate
from groupwise.envs.tictactoe.env import FORMAT_PENALTY, REWARD_DRAW, REWARD_INVALID, REWARD_WIN, parse_cell_loose
from groupwise.envs.tictactoe.game import (
    EMPTY_BOARD,
    best_moves,
    is_over,
    legal_moves,
    minimax_move,
    minimax_value,
    play,
    to_move,
    winner,
)


def test_rules():
    assert winner("XXX OO   ") == "X" and winner("XO  X O  ") is None
    assert winner("O  XO X O") == "O"  # diagonal 0-4-8
    assert winner("X O XO  O") == "O"  # column 2-5-8
    assert to_move(EMPTY_BOARD) == "X" and to_move("X        ") == "O"
    assert legal_moves("XXXOO    ") == []  # game over: no legal moves
    assert is_over("XOXXOOOXX") and winner("XOXXOOOXX") is None  # a full board, no line: draw
    with pytest.raises(ValueError, match="not a legal move"):
        play("X        ", 0)


def test_minimax_values_pinned():
    assert minimax_value(EMPTY_BOARD) == 0  # perfect play draws
    # X X _ / O O _ / _ _ _, X to move: X wins at cell 2 (and only there, else O wins at 5)
    assert minimax_value("XX OO    ") == 1 and best_moves("XX OO    ") == [2]
    # same, O to move (X has one extra): O wins at 5
    assert minimax_value("XX OO X  ") == -1 and best_moves("XX OO X  ") == [5]


def _losses(board: str, minimax_mark: str) -> tuple[int, int]:
    """(games, games minimax lost) over EVERY opponent line and EVERY optimal minimax choice."""
    if is_over(board):
        return 1, int(winner(board) not in (None, minimax_mark))
    moves = best_moves(board) if to_move(board) == minimax_mark else legal_moves(board)
    games = lost = 0
    for m in moves:
        g, l = _losses(play(board, m), minimax_mark)
        games, lost = games + g, lost + l
    return games, lost


@pytest.mark.parametrize("mark", ["X", "O"])
def test_minimax_never_loses_against_any_line(mark):
    games, lost = _losses(EMPTY_BOARD, mark)
    assert games > 100 and lost == 0


def test_minimax_against_itself_draws():
    for seed in range(10):
        rng, board = random.Random(seed), EMPTY_BOARD
        while not is_over(board):
            board = play(board, minimax_move(board, rng))
        assert winner(board) is None


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<move>5</move>", 5),
        ("<move> 1 </move>", 1),
        ("The centre is best: <move>5</move>", 5),
        ("<MOVE>9</MOVE>", 9),
        ("5", None),
        ("<move>0</move>", None),
        ("<move>10</move>", None),
        ("<move>B2</move>", None),
        ("<move>5</move><move>6</move>", None),
        ("", None),
    ],
)
def test_parse_cell(reply, expected):
    assert parse_cell(reply) == expected


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("I take 7!", 7),
        ("cell 5.", 5),
        ("5, yes 5", 5),
        ("5 or 6", None),
        ("12", None),
        ("3.5", None),
        (" X | 2 | 3", None),
        ("the centre", None),
    ],
)
def test_parse_cell_loose(reply, expected):
    assert parse_cell_loose(reply) == expected


async def test_rollout_win_and_invalid(scripted):
    # The agent (X) plays the first free cell of the top row, then of the rest; against a seeded
    # random opponent we check the glue, not the play: replay the game by hand.
    def first_free(body):
        board_text = body["messages"][-1]["content"].split(":\n", 1)[1].split("\nWhich")[0]
        free = [int(c) for c in board_text if c.isdigit()]
        return f"<move>{free[0]}</move>"

    model = scripted(first_free)
    traj = await rollout(model, ScenarioTicTacToe(seed=4))
    final = traj.metadata["final_board"]
    assert is_over(final) and traj.metrics["invalid_move"] == 0.0
    expected = {"X": 1.0, "O": 0.0, None: 0.5}[winner(final)]
    assert traj.reward == expected and validate(traj) == float(winner(final) == "X")
    assert len(traj.choices()) == len(model.requests) == traj.metrics["moves"] == final.count("X")

    bad = scripted(["<move>1</move>", "<move>1</move>"])  # the second reply names an occupied cell
    traj = await rollout(bad, ScenarioTicTacToe(seed=4))
    # -1 + 0.2 x the one valid move made before the invalid one
    assert traj.reward == pytest.approx(REWARD_INVALID + 0.2)
    assert traj.metrics["invalid_move"] == 1.0 and traj.metrics["loss"] == 1.0
    assert REWARD_WIN == 1.0


async def test_lenient_moves_cost_the_format_penalty(scripted):
    # X always takes the first free cell, untagged ("I take cell N."); the outcome is read from the
    # final board, the penalty is pinned.
    def loose_first_free(body):
        board_text = body["messages"][-1]["content"].split(":\n", 1)[1].split("\nWhich")[0]
        return f"I take cell {[c for c in board_text if c.isdigit()][0]}."

    traj = await rollout(scripted(loose_first_free), ScenarioTicTacToe(seed=0))
    outcome = {"X": REWARD_WIN, None: REWARD_DRAW, "O": 0.0}[winner(traj.metadata["final_board"])]
    # every move was untagged: outcome - 0.5 * moves / moves
    assert traj.reward == pytest.approx(outcome - FORMAT_PENALTY) and traj.metrics["format_rate"] == 0.0


async def test_rollout_as_o_against_minimax_starts_with_the_opponents_move(scripted):
    model = scripted(["<move>notacell</move> nor any number"])
    traj = await rollout(model, ScenarioTicTacToe(seed=0, opponent="minimax", agent_mark="O"))
    first_board = traj.messages()[1]["content"]
    assert "X" in first_board and traj.metrics["invalid_move"] == 1.0


async def test_minimax_env_counts_a_perfect_agents_draws_as_not_lost(scripted):
    """An agent that plays minimax itself (reading the board off the prompt) never loses to minimax: every
    held-out game of `tictactoe-minimax` is a draw, which its metric counts; an invalid game is lost."""
    from groupwise.envs import get_env

    def perfect(body):
        board_text = body["messages"][-1]["content"].split(":\n", 1)[1].split("\nWhich")[0]
        cells = [c for c in board_text if c.isdigit() or c in "XO"]
        board = "".join(" " if c.isdigit() else c for c in cells)
        return f"<move>{minimax_move(board) + 1}</move>"

    spec = get_env("tictactoe-minimax")
    _, val, _ = spec.scenarios(0)
    assert all(s.opponent == "minimax" for s in val)
    for s in val[:6]:
        traj = await rollout(scripted(perfect), s)
        assert traj.metrics["draw"] == 1.0 and spec.validate(traj) == 1.0
    broken = await rollout(scripted(["no move here"]), val[0])
    assert spec.validate(broken) == 0.0


async def test_a_reply_with_a_lone_surrogate_is_played_on_and_stored(scripted, tmp_path):
    """An endpoint's JSON can carry "\\ud800": the Choice then holds a lone surrogate, which used to
    make the next request unencodable (the openai client raised) and the step's trajectories unstorable."""
    from groupwise import TrajectoryGroup
    from groupwise.runs.store import RunStore

    def first_free(body):
        board_text = body["messages"][-1]["content"].split(":\n", 1)[1].split("\nWhich")[0]
        return f"\ud800 <move>{[int(c) for c in board_text if c.isdigit()][0]}</move> \udfff"

    model = scripted(first_free)
    traj = await rollout(model, ScenarioTicTacToe(seed=4))
    assert traj.metrics["invalid_move"] == 0.0 and len(model.requests) >= 2
    assert traj.choices()[0].message.content.startswith("\ud800")  # kept as the model sent it
    assert model.requests[1]["messages"][2]["content"].startswith("\\ud800")  # sent on, escaped
    store = RunStore(tmp_path, "tictactoe", "agent")
    store.write_trajectories("train", 0, [TrajectoryGroup([traj])])
    assert store.load_trajectories("train", 0)[0].trajectories == [traj]


async def test_demonstration_is_what_the_rollout_records_and_never_loses(scripted):
    """The scripted demonstrator (`--sft N`'s): tagged minimax moves. Replayed as a model's replies, its
    moves make the rollout record the same game (the opponent's seed is the scenario's), with the same
    reward and metrics; against a random opponent minimax wins or draws every game, never an invalid one."""
    from groupwise.envs import get_env
    from groupwise.envs.tictactoe import demonstration

    train = get_env("tictactoe").scenarios(3)[0][:40]
    outcomes = set()
    for s in train:
        demo = demonstration(s)
        replies = [m["content"] for m in demo.messages_and_choices if m.get("role") == "assistant"]
        assert all(parse_cell(r) is not None for r in replies)
        traj = await rollout(scripted(replies), s)
        assert traj.messages() == demo.messages()
        timing = ("duration",)  # each trajectory's own wall time
        assert traj.reward == demo.reward
        assert {k: v for k, v in traj.metrics.items() if k not in timing} == \
            {k: v for k, v in demo.metrics.items() if k not in timing}
        assert demo.metrics["invalid_move"] == 0.0 and demo.metrics["loss"] == 0.0
        outcomes.add(demo.reward)
    assert outcomes <= {REWARD_WIN, REWARD_DRAW} and REWARD_WIN in outcomes
    # the minimax env's demonstrations draw against minimax (its best)
    spec = get_env("tictactoe-minimax")
    assert spec.demonstrate is not None
    assert all(spec.validate(spec.demonstrate(s)) == 1.0 for s in spec.scenarios(3)[0][:6])
