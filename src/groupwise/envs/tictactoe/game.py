"""Tic-tac-toe, the rules only: board, winner, legal moves, a memoised minimax, a random player.

A board is a 9-character string, cells 0..8 row by row, each "X", "O" or " ". X moves first, so
whose turn it is follows from the counts. Strings are immutable and hashable, which lets minimax
memoise on the board alone (the player to move is a function of the board).
"""

from __future__ import annotations

import random
from functools import lru_cache

from groupwise.errors import ConfigError

EMPTY_BOARD = " " * 9
LINES: tuple[tuple[int, int, int], ...] = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8),  # rows
    (0, 3, 6), (1, 4, 7), (2, 5, 8),  # columns
    (0, 4, 8), (2, 4, 6),             # diagonals
)


def to_move(board: str) -> str:
    """Whose turn it is: X when the counts are equal (X starts), else O."""
    return "X" if board.count("X") == board.count("O") else "O"


def other(mark: str) -> str:
    return "O" if mark == "X" else "X"


def winner(board: str) -> str | None:
    for a, b, c in LINES:
        if board[a] != " " and board[a] == board[b] == board[c]:
            return board[a]
    return None


def legal_moves(board: str) -> list[int]:
    """Empty cells, in index order; none once the game is over."""
    if winner(board) is not None:
        return []
    return [i for i, v in enumerate(board) if v == " "]


def is_over(board: str) -> bool:
    return winner(board) is not None or " " not in board


def play(board: str, cell: int) -> str:
    """The board after the player to move takes `cell`. Raises on an illegal move."""
    if cell not in legal_moves(board):
        raise ConfigError(f"cell {cell} is not a legal move on {board!r} (legal: {legal_moves(board)})",
                          what="tic-tac-toe move")
    return board[:cell] + to_move(board) + board[cell + 1:]


@lru_cache(maxsize=None)
def minimax_value(board: str) -> int:
    """The game's value with perfect play from here: +1 X wins, 0 draw, -1 O wins.

    X maximises, O minimises. Memoised: tic-tac-toe has 5,478 reachable positions, so the first call
    explores them all once and every later call is a lookup.
    """
    w = winner(board)
    if w is not None:
        return 1 if w == "X" else -1
    moves = legal_moves(board)
    if not moves:
        return 0
    values = [minimax_value(play(board, m)) for m in moves]
    return max(values) if to_move(board) == "X" else min(values)


def best_moves(board: str) -> list[int]:
    """Every move that keeps the best value for the player to move."""
    moves = legal_moves(board)
    values = {m: minimax_value(play(board, m)) for m in moves}
    best = (max if to_move(board) == "X" else min)(values.values())
    return [m for m in moves if values[m] == best]


def minimax_move(board: str, rng: random.Random | None = None) -> int:
    """An optimal move; among equally good ones the first, or a random one when `rng` is given."""
    moves = best_moves(board)
    return moves[0] if rng is None else rng.choice(moves)


def random_move(board: str, rng: random.Random) -> int:
    return rng.choice(legal_moves(board))


def render(board: str) -> str:
    """The board as text; an empty cell shows its number 1..9, which is how the agent names it."""
    cells = [v if v != " " else str(i + 1) for i, v in enumerate(board)]
    rows = [" " + " | ".join(cells[r * 3:(r + 1) * 3]) for r in range(3)]
    return "\n---+---+---\n".join(rows)
