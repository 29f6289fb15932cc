"""The notebooks ART's README links to (OpenPipe/art-notebooks, art_repo/notebooks/), run as their
authors wrote them with only the import changed, shrunk to a step or two on the tiny random model:
what an ART user has, beside the programs of ART's own repository (test_art_examples.py).
Their RULER judge is the local stand-in `stub_judge`, reached through OPENAI_BASE_URL."""

from __future__ import annotations

import pytest

import groupwise as gw
from art_runner import Program, run_program
from groupwise.errors import ArtCompatWarning
from test_art_external import ENRON_EMAILS, ENRON_QUESTIONS, enron_email, enron_question

NB = "notebooks/examples"
INSTALL = "Colab install cell (not copied)"
UNSLOTH_DEMO = "the Unsloth chat demo: CUDA only (not copied)"


def _runs(root) -> list:
    """The run folders a program wrote (``<path>/<project>/models/<model>``, beside the program)."""
    return sorted(p.parent for p in root.rglob("history.jsonl"))


def _judge_env(stub_judge) -> dict[str, str]:
    return {"OPENAI_API_KEY": "sk-stub", "OPENAI_BASE_URL": stub_judge.base_url}


def test_tic_tac_toe_notebook(art_model_dir, tmp_path):
    run_program(Program(
        f"{NB}/tic_tac_toe/tic-tac-toe.ipynb",
        shrink={f"{NB}/tic_tac_toe/tic-tac-toe.ipynb": [("ROLLOUTS_PER_STEP = 48", "ROLLOUTS_PER_STEP = 3", 1)]},
        skip_cells={0: INSTALL, 7: UNSLOTH_DEMO}, base_models=("Qwen/Qwen2.5-3B-Instruct",),
    ), tmp_path, art_model_dir)
    runs = _runs(tmp_path)
    assert len(runs) == 1
    # TRAINING_STEPS = 2: backend.train's rows (steps 0, 1) and the notebook's model.log after each, at
    # the step it returned (1, 2), which replaces backend.train's row of that step
    assert [r["step"] for r in gw.load_history(runs[0]) if r["split"] == "train"] == [0, 1, 2]
    assert [p.name for p in (runs[0] / "checkpoints").iterdir()] == ["0002"]  # delete_checkpoints kept the last


def test_2048_ruler_notebook(art_model_dir, tmp_path, stub_judge):
    run_program(Program(
        f"{NB}/2048/2048-ruler.ipynb",
        shrink={f"{NB}/2048/2048-ruler.ipynb": [
            ('OPENAI_API_KEY = ""', 'OPENAI_API_KEY = "sk-stub"', 1),  # where the notebook asks for the user's key
            ("range(await model.get_step(), 10)", "range(await model.get_step(), 1)", 1),
            ("for _ in range(18)", "for _ in range(3)", 1)]},
        skip_cells={1: INSTALL, 7: UNSLOTH_DEMO}, base_models=("Qwen/Qwen2.5-3B-Instruct",),
        env={"OPENAI_BASE_URL": stub_judge.base_url},
    ), tmp_path, art_model_dir)
    assert len(stub_judge.requests) >= 2  # the RULER demo's group, then each trained group
    runs = _runs(tmp_path)
    assert [r["step"] for r in gw.load_history(runs[0]) if r["split"] == "train"] == [0, 1]  # one step, logged after
    assert [p.name for p in (runs[0] / "checkpoints").iterdir()] == ["0001"]


def test_art_e_langgraph_notebook(art_model_dir, tmp_path, stub_judge):
    run_program(Program(
        f"{NB}/langgraph/art-e-langgraph.ipynb",
        shrink={f"{NB}/langgraph/art-e-langgraph.ipynb": [
            ('"rollouts_per_group": 4', '"rollouts_per_group": 2', 1), ('"max_steps": 20', '"max_steps": 0', 1)]},
        skip_cells={0: INSTALL}, base_models=("Qwen/Qwen2.5-7B-Instruct",),
        env={**_judge_env(stub_judge), "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        hub={(ENRON_EMAILS, "train"): [enron_email(i) for i in range(3)],
             (ENRON_QUESTIONS, "train"): [enron_question(0), enron_question(1)]},
    ), tmp_path, art_model_dir)
    assert stub_judge.requests  # the RULER cell judged a group of LangGraph rollouts


def test_sft_from_a_file_notebook_on_serverless_backend(art_model_dir, tmp_path):
    """ServerlessBackend (W&B's hosted service in ART) is a LocalBackend here, and says so."""
    with pytest.warns(ArtCompatWarning, match="ServerlessBackend\\(\\): groupwise has no hosted training service"):
        run_program(Program(
            f"{NB}/sft/train_from_file.ipynb", skip_cells={0: INSTALL}, base_models=("Qwen/Qwen3.6-27B",),
            hub={("gretelai/synthetic_text_to_sql", "train"): [
                {"sql_context": "CREATE TABLE t (a INT);", "sql_prompt": f"row {i}", "sql": f"SELECT {i};"}
                for i in range(200)]},
        ), tmp_path, art_model_dir)
    runs = _runs(tmp_path)
    assert len(runs) == 1
    assert [r["split"] for r in gw.load_history(runs[0])] == ["sft"]
