"""Third-party ART programs (public repositories other than OpenPipe/ART), each run for one training
step on the tiny random model with only its `art` imports changed (art_runner's port) and its sizes
shrunk, against local stand-ins of the services it reaches: hosted judges and models are the stub
judge (an OpenAI-compatible endpoint answering RULER's prompt), web search and ZenML are seams.

corpus/README.md lists each program's source and licence, and why the files are restatements of
the programs' use of ART rather than copies. A program that breaks in an area another change owns
(W&B, LiteLLM's conventions, signatures, hooks, metadata edges) is an xfail(strict=True) naming the
break, so the test turns red, to be flipped, the day it runs."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from fastapi import FastAPI

import groupwise as gw
from art_runner import SEAMS, Program, run_program

CORPUS = Path(__file__).parent / "corpus"
LOCAL_JUDGE_PORT = 6688  # the port the programs' own local judge listens on


def _serve_on(app: FastAPI, port: int):
    import uvicorn

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the local judge did not start"
        time.sleep(0.01)

    def stop():
        server.should_exit = True
        thread.join(10)
        sock.close()

    return stop


@pytest.fixture
def local_judge(stub_judge):
    """The programs' own judge at localhost:6688 (a vLLM or a proxy there, in their authors' setup):
    the stub judge, served there too, at the OpenAI routes with and without /v1 (LiteLLM appends
    /chat/completions to an api_base as given)."""
    (route,) = [r for r in stub_judge.app.routes if getattr(r, "path", "") == "/v1/chat/completions"]
    stub_judge.app.add_api_route("/chat/completions", route.endpoint, methods=["POST"])
    stop = _serve_on(stub_judge.app, LOCAL_JUDGE_PORT)
    yield stub_judge
    stop()


def _run_dir(root: Path, project: str, name: str) -> Path:
    return root / ".groupwise" / project / "models" / name


def _train_steps(run: Path) -> list[int]:
    return [r["step"] for r in gw.load_history(run) if r["split"] == "train"]


def test_langgraph_multi_agent_with_a_local_judge_and_wandb(art_model_dir, tmp_path, local_judge, monkeypatch):
    """johnson7788/RLDecisionAgent ART_Langgraph_multi: LangGraph planner + ReAct researcher, RULER with
    `extra_litellm_params={"api_base": "http://localhost:6688"}`, W&B (offline here)."""
    program = Program(
        "train.py", root=CORPUS / "rldecision_multi",
        shrink={"train.py": [('"groups_per_step": 2', '"groups_per_step": 1', 1),
                             ('"rollouts_per_group": 4', '"rollouts_per_group": 2', 1),
                             ('"max_steps": 5', '"max_steps": 0', 1)]},
        base_models=("Qwen/Qwen2.5-0.5B-Instruct",),
        env={"ZHIPU_API_KEY": "stub", "OPENAI_API_KEY": "sk-local", "WANDB_MODE": "offline",
             "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"},
    )
    run_program(program, tmp_path, art_model_dir)
    run = _run_dir(tmp_path, "web-search-agent-training", "web-search")
    assert _train_steps(run) == [0]
    # the group was judged by the program's own judge, as LiteLLM's api_base says, with its key
    assert local_judge.requests and {r["auth"] for r in local_judge.requests} == {"Bearer sk-local"}
    assert (tmp_path / "wandb").is_dir()  # the program's own W&B run, offline


def _hn_story(i: int, split: str) -> dict:
    return {"id": i, "title": f"Show HN: thing {i}", "by": f"user{i}", "score": 20 + i, "split": split,
            "scraped_body": f"We built a tiny thing, number {i}. It parses logs and draws a chart."}


def test_single_turn_titles_with_a_local_reward(art_model_dir, tmp_path):
    """johnson7788/RLDecisionAgent ART_title_generator: `_internal_config=art.dev.InternalModelConfig(...)`
    in the constructor, lists of trajectories (not groups) to `model.train`, validation through
    `gather_trajectories` + `model.log` + `delete_checkpoints`."""
    hn = "OpenPipe/hacker-news-scraped-stories-filtered"
    program = Program(
        "train.py", helpers=("utils.py",), root=CORPUS / "rldecision_titles",
        shrink={"train.py": [("TRAINING_DATASET_SIZE = 5000", "TRAINING_DATASET_SIZE = 2", 1),
                             ("VAL_SET_SIZE = 100", "VAL_SET_SIZE = 1", 1), ("EVAL_STEPS = 50", "EVAL_STEPS = 1", 1),
                             ("NUM_GENERATIONS = 6", "NUM_GENERATIONS = 2", 1)]},
        base_models=("Qwen/Qwen2.5-0.5B-Instruct",),
        hub={(hn, "train"): [_hn_story(i, "train") for i in range(2)], (hn, "val"): [_hn_story(5, "val")]},
    )
    run_program(program, tmp_path, art_model_dir)
    run = _run_dir(tmp_path, "hn_title_generation", "001")
    history = gw.load_history(run)
    assert _train_steps(run) == [0, 1]
    assert {"rm", "length", "matches"} <= {k.split("/")[-1] for r in history if r["split"] == "train" for k in r}
    assert [r["step"] for r in history if r["split"] == "val"] == [2]  # logged after step 1's update
    # delete_checkpoints kept the latest only
    assert [p.name for p in sorted((run / "checkpoints").iterdir())] == ["0002"]


def test_shell_agent_with_a_remote_inference_server(art_model_dir, tmp_path):
    """deathbyknowledge/shellm: a shell agent whose turns come from a remote vLLM (here a groupwise
    server of the tiny model under the run's name), a TrainableModel[RunConfig] copied deeply per
    run and picked by --model, `with LocalBackend() as backend`, validation through `model.log`."""
    from groupwise.local import LocalBackend

    with LocalBackend(path=str(tmp_path / "remote")) as remote:
        served = gw.TrainableModel(name="run_1", project="remote", base_model=art_model_dir)
        import asyncio

        asyncio.run(served.register(remote))
        shrink = {"project_types.py": [("groups_per_step: int = 8", "groups_per_step: int = 1", 1),
                                       ("rollouts_per_group: int = 6", "rollouts_per_group: int = 2", 1),
                                       ("training_num_scenarios: int = 1000", "training_num_scenarios: int = 1", 1),
                                       ("validation_num_scenarios: int = 32", "validation_num_scenarios: int = 1", 1),
                                       ("num_epochs: int = 3", "num_epochs: int = 1", 1)],
                  "run_agent.py": [("MAX_TURNS = 30", "MAX_TURNS = 2", 1)]}
        program = Program(
            "train.py", root=CORPUS / "shellm", argv=("--model", "run_1"),
            helpers=("run_agent.py", "project_types.py", "all_experiments.py", "load_scenarios.py", "sandbox.py",
                     "benchmark.py"),
            shrink=shrink, base_models=("deathbyknowledge/Qwen3-8B-Shell-SFT",),
            endpoints={"http://rearden:8000/v1": (served.inference_base_url, served.inference_api_key)},
        )
        run_program(program, tmp_path, art_model_dir)
    run = _run_dir(tmp_path, "shell-agent-test", "run_1")
    history = gw.load_history(run)
    assert _train_steps(run) == [0]
    assert [(r["step"], r["n_trajectories"]) for r in history if r["split"] == "val"] == [(0, 1)]


def test_mcp_agent_with_a_deepseek_judge_applied_after_each_group(art_model_dir, tmp_path, stub_judge):
    """johnson7788/RLDecisionAgent ART_mcp-rl: an MCP (stdio) calculator agent, a prompted control model
    at DeepSeek's URL, RULER with `deepseek/deepseek-chat` through `after_each=`, validation logged."""
    mcp = "servers/python/mcp_caculator/"
    program = Program(
        "mcp_rl/train.py", root=CORPUS / "rldecision_mcp_rl", package="mcp_rl", package_roots=(".",),
        argv=("--models", "mcp-7b-001"),
        helpers=("all_experiments.py", "mcp_rl/__init__.py", "mcp_rl/rollout.py", "mcp_rl/benchmarks/__init__.py",
                 "mcp_rl/benchmarks/generate_benchmarks.py", mcp + "server.py", mcp + "server_params.py",
                 mcp + "scenarios/train.jsonl", mcp + "scenarios/val.jsonl"),
        shrink={"all_experiments.py": [("trajectories_per_group: int = 7", "trajectories_per_group: int = 2", 1),
                                       ("groups_per_step: int = 4", "groups_per_step: int = 1", 1),
                                       ("training_dataset_size: int = 16", "training_dataset_size: int = 1", 1),
                                       ("num_epochs=20", "num_epochs=1", 1), ("max_turns: int = 5", "max_turns: int = 2", 1)]},
        base_models=("Qwen/Qwen2.5-0.5B-Instruct",),
        env={"DEEPSEEK_API_KEY": "sk-deepseek", "DEEPSEEK_API_BASE": stub_judge.base_url},
        endpoints={"https://api.deepseek.com/v1": stub_judge.base_url},
    )
    run_program(program, tmp_path, art_model_dir)
    run = _run_dir(tmp_path, "mcp-agent-training", "mcp-7b-001")
    history = gw.load_history(run)
    assert _train_steps(run) == [0]
    assert [r["step"] for r in history if r["split"] == "val"] == [0]
    # the trained group was judged (RULER keeps each rollout's own reward as independent_reward), and
    # the only DeepSeek there is is the stand-in at the base URL DEEPSEEK_API_BASE names
    (train,) = [r for r in history if r["split"] == "train"]
    assert "independent_reward" in train, sorted(train)
    assert "deepseek-chat" in {r["model"] for r in stub_judge.requests}


def test_zenml_pipeline_langgraph_email_agent(art_model_dir, tmp_path, stub_judge, monkeypatch):
    """zenml-io/zenml-projects art-rl: a ZenML step running ART's loop, `_internal_config` set after
    construction, `LocalBackend(in_process=True, path="./.art")`, RULER with o4-mini (hosted: the stub
    judge through OPENAI_BASE_URL), `delete_checkpoints`, train's `_config`."""
    monkeypatch.syspath_prepend(str(SEAMS))
    import zenml  # the stand-in, the module the program will import

    zenml.LOGGED.clear()
    program = Program(
        "run.py", root=CORPUS / "zenml_art_rl", package_roots=(".",),
        helpers=("steps/training/train_agent.py", "steps/training/setup_model.py", "agent/rollout.py",
                 "agent/judge.py", "environment/models.py", "environment/tools.py"),
        shrink={"run.py": [("groups_per_step: int = 2", "groups_per_step: int = 1", 1),
                           ("rollouts_per_group: int = 4", "rollouts_per_group: int = 2", 1),
                           ("max_steps: int = 20", "max_steps: int = 0", 1)]},
        base_models=("Qwen/Qwen2.5-7B-Instruct",),
        env={"OPENAI_API_KEY": "sk-stub", "OPENAI_BASE_URL": stub_judge.base_url},
    )
    run_program(program, tmp_path, art_model_dir)
    run = tmp_path / ".art" / "email-search-agent" / "models" / "art-email-agent"  # ART's own path, by hand
    assert _train_steps(run) == [0]
    assert [m["step"] for m in zenml.LOGGED] == [0]
    assert stub_judge.requests


def test_email_search_agent_through_litellm(art_model_dir, tmp_path, stub_judge):
    """johnson7788/RLDecisionAgent ART_Search_Email: the agent's own turns through LiteLLM
    (`hosted_vllm/<name>` at the model's base URL, `convert_litellm_choice_to_openai`), SQLite FTS5
    tools converted by LangChain, RULER with o4-mini."""
    from datetime import datetime

    emails = [{"message_id": f"<{i}@enron>", "subject": f"Gas contract {i}", "from": f"s{i}@enron.com",
               "to": ["jeff@enron.com"], "cc": [], "bcc": [], "date": datetime(2001, 3, 1 + i, 9, 30),
               "body": f"Gas contract {i} closes on Friday.", "file_name": f"jeff/{i}."} for i in range(3)]
    questions = [{"id": i, "question": f"When does gas contract {i} close?", "answer": "Friday",
                  "message_ids": [f"<{i}@enron>"], "how_realistic": 0.9, "inbox_address": "jeff@enron.com",
                  "query_date": "2001-05-01"} for i in range(2)]
    program = Program(
        "train_email_search_agent.py", root=CORPUS / "rldecision_email",
        argv=("train", "--max-steps", "0", "--groups-per-step", "1", "--rollouts-per-group", "2"),
        shrink={"train_email_search_agent.py": [("MAX_TURNS = 10", "MAX_TURNS = 2", 1)]},
        base_models=("Qwen/Qwen2.5-7B-Instruct",),
        hub={("corbt/enron-emails", "train"): emails, ("corbt/enron_emails_sample_questions", "train"): questions},
        env={"OPENAI_API_KEY": "sk-stub", "OPENAI_BASE_URL": stub_judge.base_url},
    )
    run_program(program, tmp_path, art_model_dir)
    run = tmp_path / ".art" / "email-search-agent" / "models" / "email-agent-001"
    assert _train_steps(run) == [0]
    assert stub_judge.requests


def test_langgraph_outline_agent_with_its_own_reward(art_model_dir, tmp_path):
    """johnson7788/RLDecisionAgent MCP_Agents/rl_train: a LangGraph tool agent whose reward is the
    program's own, read back from the tool messages in `traj.messages_and_choices` (dicts there)."""
    program = Program(
        "train.py", helpers=("reward.py",), root=CORPUS / "rldecision_outline",
        shrink={"train.py": [('"groups_per_step": 2', '"groups_per_step": 1', 1),
                             ('"rollouts_per_group": 3', '"rollouts_per_group": 2', 1),
                             ('"max_steps": 6', '"max_steps": 0', 1)]},
        base_models=("Qwen/Qwen2.5-0.5B-Instruct",),
        env={"ZHIPU_API_KEY": "stub", "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"},
    )
    run_program(program, tmp_path, art_model_dir)
    run = _run_dir(tmp_path, "content-training", "outline-webfill")
    assert _train_steps(run) == [0]
    assert (tmp_path / "wandb").is_dir()


def test_2048_game_with_a_local_judge_after_each_group(art_model_dir, tmp_path, local_judge):
    """johnson7788/RLDecisionAgent ART_2048: a game, RULER in `after_each=` with a local judge
    (`extra_litellm_params` api_base localhost:6688) and `swallow_exceptions=True`."""
    program = Program(
        "train.py", helpers=("rollout.py",), root=CORPUS / "rldecision_2048",
        shrink={"train.py": [("TRAIN_STEPS = 40", "TRAIN_STEPS = 1", 1),
                             ("SIMULTANEOUS_GAMES = 18", "SIMULTANEOUS_GAMES = 2", 1)]},
        base_models=("Qwen/Qwen2.5-0.5B-Instruct",), env={"OPENAI_API_KEY": "sk-local"},
    )
    run_program(program, tmp_path, art_model_dir)
    run = _run_dir(tmp_path, "2048", "tutorial-001")
    assert _train_steps(run) == [0]
    assert local_judge.requests and {r["auth"] for r in local_judge.requests} == {"Bearer sk-local"}


def test_a_prompted_model_trained_stops_as_in_art(art_model_dir, tmp_path, stub_judge):
    """johnson7788/RLDecisionAgent ART_Langgraph: declares `art.Model` (prompted), registers it, gathers
    and judges, then calls `model.train`, which ART's `Model` lacks too: the same AttributeError, after
    the rollouts and the judge ran (ART's `Model.get_step` answers 0 for a prompted model)."""
    program = Program(
        "train.py", root=CORPUS / "rldecision_websearch",
        shrink={"train.py": [('"groups_per_step": 2', '"groups_per_step": 1', 1),
                             ('"rollouts_per_group": 4', '"rollouts_per_group": 2', 1)]},
        env={"ZHIPU_API_KEY": "stub", "OPENAI_API_KEY": "sk-stub", "OPENAI_BASE_URL": stub_judge.base_url},
    )
    with pytest.raises(AttributeError, match="'Model' object has no attribute 'train'"):
        run_program(program, tmp_path, art_model_dir)
    assert stub_judge.requests  # the prompted model's turns and RULER reached the hosted stand-in


def test_temporal_clue_puzzles_with_concurrent_validation(art_model_dir, tmp_path):
    """johnson7788/RLDecisionAgent ART_temporal_clue: validation and training gathered at once
    (`asyncio.gather` of two `gather_trajectory_groups`), `_internal_config` as a dict, `art.Messages`."""
    entry = "temporal-clue.py"
    program = Program(
        entry, helpers=("puzzles.json",), root=CORPUS / "rldecision_temporal_clue",
        shrink={entry: [("puzzles[:64]", "puzzles[:1]", 1), ("puzzles[64:128]", "puzzles[1:1]", 1),
                        ("puzzles[128:]", "puzzles[1:]", 1), ("range(50)", "range(2)", 1), ("stride = 4", "stride = 1", 1),
                        ("1_000", "1", 1)]},
        base_models=("Qwen/Qwen2.5-7B-Instruct",),
    )
    run_program(program, tmp_path, art_model_dir)
    run = _run_dir(tmp_path, "temporal-clue", "001")
    history = gw.load_history(run)
    assert _train_steps(run) == [0]
    assert [(r["step"], r["n_groups"]) for r in history if r["split"] == "val"] == [(0, 1)]
    assert "acc" in {k.split("/")[-1] for r in history if r["split"] == "train" for k in r}
