# Restated from johnson7788/RLDecisionAgent, backend/ART_2048/rollout.py (corpus/README.md): a game of
# 2048 played through the model's OpenAI client, one move per turn as <move>left</move>; an invalid
# move ends the game; the reward grows with the largest tile. Every use of ART is kept.
import math
import random
import re

import art
from openai import AsyncOpenAI

WINNING_VALUE = 64
MOVES = ("left", "right", "up", "down")


def new_board() -> list[list[int]]:
    board = [[0] * 4 for _ in range(4)]
    for _ in range(2):
        add_tile(board)
    return board


def add_tile(board) -> None:
    empty = [(r, c) for r in range(4) for c in range(4) if board[r][c] == 0]
    if empty:
        r, c = random.choice(empty)
        board[r][c] = 2 if random.random() < 0.9 else 4


def _slide(row: list[int]) -> list[int]:
    tiles = [v for v in row if v]
    out = []
    while tiles:
        if len(tiles) > 1 and tiles[0] == tiles[1]:
            out.append(tiles[0] * 2)
            tiles = tiles[2:]
        else:
            out.append(tiles.pop(0))
    return out + [0] * (4 - len(out))


def apply_move(board, move: str):
    rows = [list(r) for r in board] if move in ("left", "right") else [list(c) for c in zip(*board)]
    moved = [_slide(r[::-1])[::-1] if move in ("right", "down") else _slide(r) for r in rows]
    return moved if move in ("left", "right") else [list(r) for r in zip(*moved)]


def render(board) -> str:
    return "\n".join("|".join(f"{v or '_':>4}" for v in row) for row in board)


async def rollout(model: art.Model, step: int, is_validation: bool) -> art.Trajectory:
    client = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    board = new_board()
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "system", "content": "You play 2048. Answer with <move>left|right|up|down</move>."}],
        metadata={"step": step, "validation": is_validation}, reward=0)
    while True:
        trajectory.messages_and_choices.append({"role": "user", "content": render(board)})
        completion = await client.chat.completions.create(max_completion_tokens=32, messages=trajectory.messages(),
                                                          model=model.name)
        choice = completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        match = re.search(r"<move>(\w+)</move>", choice.message.content or "")
        if not match or match.group(1) not in MOVES:
            trajectory.metrics["invalid_move"] = 1
            break
        after = apply_move(board, match.group(1))
        if after == board:
            trajectory.metrics["invalid_move"] = 1
            break
        board = after
        add_tile(board)
        if max(map(max, board)) >= WINNING_VALUE:
            break
    max_value = max(map(max, board))
    trajectory.metrics["max_value"] = max_value
    trajectory.reward = math.log(max_value, 2) / math.log(WINNING_VALUE, 2)
    return trajectory
