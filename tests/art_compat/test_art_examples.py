"""ART's example programs and notebooks, as ART wrote them (OpenPipe/ART at art_runner.ART_COMMIT),
each run through at least one training step on the tiny random model with only the import changed.

The programs' text is in art_repo/ byte for byte; art_runner.py applies the import change and the
shrinks listed here (loop counts, group sizes, data), and nothing else. docs/porting-from-art.md has
the table of every ART program and how it runs.
"""

from __future__ import annotations

import json

import pytest

import groupwise as gw
from art_runner import Program, run_program

QWEN_7B = "Qwen/Qwen2.5-7B-Instruct"
QWEN_3B = "Qwen/Qwen2.5-3B-Instruct"
COLAB_NUMPY = "Colab setup: checks that the `pip install numpy<2` cell before it took effect"
UNSLOTH_DEMO = "after training: loads the LoRA with Unsloth (CUDA only) to chat with it; not the training loop"

# ART's puzzles.json is not in the repository snapshot (a large file); three puzzles in its format
PUZZLES = json.dumps([
    {"num_clues": 2, "prompt": f"Puzzle {i}. Who did it? Answer as 'A. <name>'.", "solution": {"A": "Mrs. Peacock"}}
    for i in range(3)
])
PUZZLES_URL = "https://raw.githubusercontent.com/openpipe/art/main/examples/data/temporal-clue/puzzles.json"
PUZZLE_SPLITS = [("puzzles[:64]", "puzzles[:1]", 1), ("puzzles[64:128]", "puzzles[1:2]", 1),
                 ("puzzles[128:]", "puzzles[2:]", 1)]
CODENAMES = "https://raw.githubusercontent.com/OpenPipe/ART/refs/heads/main/examples/codenames/"
OPENAI_COMPARISONS = ("benchmarks prompted OpenAI models at the hard-coded https://api.openai.com/v1 "
                      "(an external service; no seam: the URL is in the program)")
TWO_PROMPTS = json.dumps(["respond with 'yes', 'no', 'maybe'", "respond with yes or no"])


def train_rows(root, project: str, name: str) -> list[dict]:
    return [r for r in gw.load_history(root / ".groupwise" / project / "models" / name) if r["split"] == "train"]


def one_step(path: str, count: int = 1) -> tuple[str, str, int]:
    """`range(await model.get_step(), N)` -> one step."""
    return (f"range(await model.get_step(), {path})", "range(await model.get_step(), 1)", count)


PROGRAMS = {
    "2048.py": Program(
        "examples/2048/2048.py", helpers=("examples/2048/rollout.py", "examples/2048/utils.py"),
        shrink={"examples/2048/2048.py": [one_step("100"), ("for _ in range(48)", "for _ in range(3)", 1)]},
        base_models=(QWEN_7B,),
    ),
    "tic-tac-toe.py": Program(
        "examples/tic_tac_toe/tic-tac-toe.py",
        helpers=("examples/tic_tac_toe/rollout.py", "examples/tic_tac_toe/game_utils.py"),
        shrink={"examples/tic_tac_toe/tic-tac-toe.py": [("STEP = 50", "STEP = 1", 1), ("range(96)", "range(3)", 1)]},
        base_models=("meta-llama/Meta-Llama-3.1-8B-Instruct",),
    ),
    "temporal-clue.py": Program(
        "examples/temporal_clue/temporal-clue.py",
        shrink={"examples/temporal_clue/temporal-clue.py": [
            *PUZZLE_SPLITS, one_step("1_000"), ("for _ in range(50)", "for _ in range(2)", 1)]},
        extra_files={"examples/data/temporal-clue/puzzles.json": PUZZLES},
        base_models=(QWEN_7B,),
    ),
    "temporal-clue.ipynb": Program(
        "examples/temporal_clue/temporal-clue.ipynb",
        shrink={"examples/temporal_clue/temporal-clue.ipynb": [
            *PUZZLE_SPLITS, one_step("1_000"), ("for _ in range(50)", "for _ in range(2)", 1)]},
        skip_cells={1: COLAB_NUMPY},
        extra_files={"examples/data/temporal-clue/puzzles.json": PUZZLES},
        downloads={PUZZLES_URL: "examples/data/temporal-clue/puzzles.json"},
        base_models=(QWEN_7B,),
    ),
    "qwen3_try.py": Program(
        "dev/new_models/qwen3_try.py",
        shrink={"dev/new_models/qwen3_try.py": [one_step("1_000"), ("range(32)", "range(2)", 1)]},
        extra_files={"dev/new_models/prompts.json": TWO_PROMPTS},
        base_models=("Qwen/Qwen3-0.6B",),
    ),
    "gemma3.py": Program(
        "dev/new_models/gemma3.py",
        shrink={"dev/new_models/gemma3.py": [one_step("1_000"), ("range(32)", "range(2)", 1)]},
        extra_files={"dev/new_models/prompts.json": TWO_PROMPTS},
        base_models=("google/gemma-3-4b-it",),
    ),
    "yes-no-maybe.ipynb": Program(
        "dev/yes-no-maybe.ipynb",
        shrink={"dev/yes-no-maybe.ipynb": [
            one_step("1_000"), ("range(32)", "range(2)", 1), ('["respond", "just respond"]', '["respond"]', 1),
            ("for use_quotes in [True, False]", "for use_quotes in [True]", 1)]},
        base_models=(QWEN_7B,),
    ),
    "2048.ipynb": Program(
        "examples/2048/2048.ipynb",
        shrink={"examples/2048/2048.ipynb": [one_step("10"), ("for _ in range(18)", "for _ in range(3)", 1)]},
        skip_cells={1: COLAB_NUMPY, 8: UNSLOTH_DEMO},
        base_models=(QWEN_3B,),
    ),
    "tic-tac-toe.ipynb": Program(
        "examples/tic_tac_toe/tic-tac-toe.ipynb",
        shrink={"examples/tic_tac_toe/tic-tac-toe.ipynb": [one_step("50"), ("for _ in range(48)", "for _ in range(3)", 1)]},
        skip_cells={1: COLAB_NUMPY, 9: UNSLOTH_DEMO},
        base_models=(QWEN_3B,),
    ),
    "prisoners-dilemma.ipynb": Program(
        "examples/prisoners-dilemma.ipynb",
        shrink={"examples/prisoners-dilemma.ipynb": [
            one_step("1_000"), ("PRISONERS_DILEMMA_ROUNDS = 10", "PRISONERS_DILEMMA_ROUNDS = 2", 1),
            ("for _ in range(8)", "for _ in range(2)", 2)]},
        base_models=(QWEN_7B,),
    ),
    "rock-paper-tool-use.ipynb": Program(
        "examples/rock-paper-tool-use.ipynb",
        shrink={"examples/rock-paper-tool-use.ipynb": [
            one_step("1_000"), ("for _ in range(64)", "for _ in range(3)", 1), ("for _ in range(10):", "for _ in range(2):", 1)]},
        base_models=(QWEN_7B,),
    ),
    "Codenames_RL.ipynb": Program(
        "examples/codenames/Codenames_RL.ipynb", helpers=("examples/codenames/codenames_words.json",),
        shrink={"examples/codenames/Codenames_RL.ipynb": [
            ("NUM_STEPS = 140", "NUM_STEPS = 1", 1), ("NUM_GAMES_PER_STEP = 10", "NUM_GAMES_PER_STEP = 1", 1),
            ("NUM_ROLLOUTS_PER_GAME = 20", "NUM_ROLLOUTS_PER_GAME = 2", 1),
            ("NUM_VALIDATION_GAMES = 50", "NUM_VALIDATION_GAMES = 1", 1)]},
        skip_cells={1: COLAB_NUMPY, 14: OPENAI_COMPARISONS,
                    15: "charts from ART's art.utils.benchmarking (not provided)", 16: "the same charts"},
        # dictionary.json (the words a clue may be) is not in the repository snapshot: the board's words
        downloads={CODENAMES + "codenames_words.json": "examples/codenames/codenames_words.json",
                   CODENAMES + "dictionary.json": "examples/codenames/codenames_words.json"},
        base_models=(QWEN_3B,),
    ),
    "2048-dev.ipynb": Program(
        "examples/2048/2048-dev.ipynb", helpers=("examples/2048/rollout.py", "examples/2048/utils.py"),
        shrink={"examples/2048/2048-dev.ipynb": [one_step("50"), ("for _ in range(4)", "for _ in range(3)", 1)]},
        skip_cells={2: OPENAI_COMPARISONS},
        base_models=(QWEN_3B,),
    ),
    "qwen3_try.ipynb": Program(
        "dev/new_models/qwen3_try.ipynb", helpers=("dev/new_models/prompts.json",),
        base_models=("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen3-0.6B"),
        # both models register and answer; the training cell names `model`, which no cell defines
        fails_in_art=("NameError", "name 'model' is not defined"),
    ),
    "2048-single-turn.ipynb": Program(
        "examples/2048/2048-single-turn.ipynb", helpers=("examples/2048/utils.py",),
        base_models=(QWEN_7B,),
        # the model registers; then `from .utils import ...`: a notebook is not a package
        fails_in_art=("ImportError", "attempted relative import with no known parent package"),
    ),
    "benchmarking_comparison_models.py": Program(
        "examples/benchmarking_comparison_models.py",
        shrink={"examples/benchmarking_comparison_models.py": [("range(6)", "range(2)", 1)]},
        base_models=("Qwen/Qwen2.5-14B-Instruct",),
        # the prompted models (api.openai.com, openrouter.ai) fail within max_exceptions=100; the
        # trained models' rollouts parse the answer with int(), which a random model's text is not
        fails_in_art=("GatherError", "invalid literal for int()"),
    ),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_art_program_runs_with_only_the_import_changed(name, art_model_dir, tmp_path, backup_bucket):
    program = PROGRAMS[name]
    if program.fails_in_art or program.fails_here:
        kind, message = program.fails_in_art or program.fails_here
        with pytest.raises(Exception) as failure:
            run_program(program, tmp_path, art_model_dir)
        assert (type(failure.value).__name__, message in str(failure.value)) == (kind, True), failure.value
        return
    run_program(program, tmp_path, art_model_dir)
    runs = sorted(p.parent for p in tmp_path.rglob("history.jsonl") if "bucket" not in p.parts)
    assert runs, "the program trained no model"
    for run in runs:
        train = [r for r in gw.load_history(run) if r["split"] == "train"]
        assert [r["step"] for r in train][:1] == [0], f"{run}: no training step 0: {train}"
