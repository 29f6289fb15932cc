"""2048, the rules only: boards, moves, merges, spawns, the end. No I/O, no LLM.

A board is a tuple of rows, each a tuple of ints (0 = empty), so boards are immutable and hashable and
every rule is a pure function. Randomness (where a tile spawns, 2 or 4) comes from a `random.Random`
the caller passes, so a game is fully determined by its seed and its moves.

Merge rule (the original game's): tiles slide toward the move's side; two equal neighbours merge into
one tile of twice the value, and a tile made by a merge does not merge again in the same move:
``[2, 2, 2, 2] -> [4, 4, 0, 0]``, ``[4, 4, 8, 0] -> [8, 8, 0, 0]``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from groupwise.errors import ConfigError

Row = tuple[int, ...]
Board = tuple[Row, ...]

DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
SPAWN_FOUR_PROBABILITY = 0.1  # the original game spawns a 4 one time in ten
SIZE = 4  # the original game's board: 4 x 4
WIN_TILE = 2048  # the tile that wins, as the game's name says


def empty_board(size: int = SIZE) -> Board:
    return tuple(tuple(0 for _ in range(size)) for _ in range(size))


def slide_row_left(row: Row) -> tuple[Row, int]:
    """Slide and merge one row to the left. Returns the new row and the points the merges made."""
    tiles = [v for v in row if v]
    out: list[int] = []
    points = 0
    i = 0
    while i < len(tiles):
        if i + 1 < len(tiles) and tiles[i] == tiles[i + 1]:
            out.append(2 * tiles[i])
            points += 2 * tiles[i]
            i += 2  # the merged tile is done for this move
        else:
            out.append(tiles[i])
            i += 1
    out.extend([0] * (len(row) - len(out)))
    return tuple(out), points


def _transpose(board: Board) -> Board:
    return tuple(zip(*board))


def _reverse_rows(board: Board) -> Board:
    return tuple(tuple(reversed(r)) for r in board)


def move(board: Board, direction: str) -> tuple[Board, int]:
    """The board after a move, and the points scored. An invalid move returns the board unchanged.

    Every direction is "left" seen from another side: right = mirror, up = transpose,
    down = transpose then mirror.
    """
    if direction not in DIRECTIONS:
        raise ConfigError(f"unknown direction {direction!r}; expected one of {DIRECTIONS}", what="2048 move")
    b = board
    if direction in ("up", "down"):
        b = _transpose(b)
    if direction in ("right", "down"):
        b = _reverse_rows(b)
    rows_points = [slide_row_left(r) for r in b]
    b = tuple(r for r, _ in rows_points)
    points = sum(p for _, p in rows_points)
    if direction in ("right", "down"):
        b = _reverse_rows(b)
    if direction in ("up", "down"):
        b = _transpose(b)
    return b, points


def is_valid_move(board: Board, direction: str) -> bool:
    """A move is valid when it changes the board (a tile slides or merges)."""
    return move(board, direction)[0] != board


def valid_moves(board: Board) -> list[str]:
    return [d for d in DIRECTIONS if is_valid_move(board, d)]


def empty_cells(board: Board) -> list[tuple[int, int]]:
    return [(r, c) for r, row in enumerate(board) for c, v in enumerate(row) if v == 0]


def spawn(board: Board, rng: random.Random) -> Board:
    """Put a 2 (or, one time in ten, a 4) on a random empty cell. A full board is returned as is."""
    cells = empty_cells(board)
    if not cells:
        return board
    r, c = cells[rng.randrange(len(cells))]
    value = 4 if rng.random() < SPAWN_FOUR_PROBABILITY else 2
    return tuple(
        tuple(value if (i, j) == (r, c) else v for j, v in enumerate(row)) for i, row in enumerate(board)
    )


def max_tile(board: Board) -> int:
    return max(max(row) for row in board)


def board_sum(board: Board) -> int:
    return sum(sum(row) for row in board)


def has_won(board: Board, win_tile: int = WIN_TILE) -> bool:
    return max_tile(board) >= win_tile


def is_terminal(board: Board, win_tile: int = WIN_TILE) -> bool:
    """The game ends when a tile reaches `win_tile` or no move changes the board."""
    return has_won(board, win_tile) or not valid_moves(board)


@dataclass
class Game:
    """One seeded game: the board, its RNG and the running score. `step` applies one move."""

    seed: int
    size: int = SIZE
    win_tile: int = WIN_TILE
    board: Board = field(init=False)
    score: int = field(init=False, default=0)
    moves: int = field(init=False, default=0)
    rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.board = spawn(spawn(empty_board(self.size), self.rng), self.rng)

    def step(self, direction: str) -> bool:
        """Apply a move; on a valid one spawn a tile and return True. An invalid move changes nothing."""
        new, points = move(self.board, direction)
        if new == self.board:
            return False
        self.board = spawn(new, self.rng)
        self.score += points
        self.moves += 1
        return True

    @property
    def won(self) -> bool:
        return has_won(self.board, self.win_tile)

    @property
    def finished(self) -> bool:
        return is_terminal(self.board, self.win_tile)


def render(board: Board) -> str:
    """The board as text, one row a line, "_" for an empty cell, columns aligned."""
    width = max(len(str(max_tile(board))), 1)
    return "\n".join(" ".join((str(v) if v else "_").rjust(width) for v in row) for row in board)
