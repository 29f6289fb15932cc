"""ART's benchmarking helpers at ART's paths, over a real run store: `art.utils.benchmarking` (0.3+:
`load_trajectories` as a polars frame, the two charts, `BenchmarkModelKey`; 0.1-0.2: `load_benchmarked_models`,
`generate_comparison_table`, `generate_line_graphs`), `art.utils.old_benchmarking`, `benchmark_rollout`,
`get_repo_root_path`, `art.skypilot`'s backend (a LocalBackend here) and the `.env` file `import art` loads."""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys

import pytest
from openai.types.chat import ChatCompletionMessage
from openai.types.chat.chat_completion import Choice

import groupwise as art
from groupwise.errors import ArtCompatWarning, ConfigError, StoreError

PROJECT = "bench-project"


def _trajectory(reward: float, win: float, answer: str = "ok") -> art.Trajectory:
    choice = Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content=answer))
    return art.Trajectory(messages_and_choices=[{"role": "user", "content": "play"}, choice], reward=reward,
                          metrics={"win": win}, metadata={"game": "g1"}, logs=["a log line"])


@pytest.fixture
def store(tmp_path):
    """A trained run (validation at steps 0, 1, 2: win rate 0.25 -> 0.5 -> 0.75) and a prompted model
    (step 0: 0.5), logged as ART programs log them."""
    async def fill():
        trained = art.Model(name="agent-001", project=PROJECT, base_path=str(tmp_path))
        for step, wins in enumerate(([0, 0, 0, 1], [0, 1, 0, 1], [1, 1, 0, 1])):
            groups = [art.TrajectoryGroup([_trajectory(w, w) for w in wins[:2]]),
                      art.TrajectoryGroup([_trajectory(w, w) for w in wins[2:]])]
            await trained.log(groups, split="val", step=step)
        prompted = art.Model(name="gpt-4o", project=PROJECT, base_path=str(tmp_path))
        await prompted.log([art.TrajectoryGroup([_trajectory(1, 1), _trajectory(0, 0)])], split="val", step=0)

    import asyncio

    asyncio.run(fill())
    return str(tmp_path)


async def test_load_trajectories_gives_arts_frame(store):
    import polars as pl

    from groupwise.utils.benchmarking.load_trajectories import load_trajectories

    df = await load_trajectories(PROJECT, art_path=store)
    assert isinstance(df, pl.DataFrame) and df.height == 4 * 3 + 2
    for column in ("model", "split", "step", "reward", "group_number", "messages", "logs", "metric_win", "metadata_game"):
        assert column in df.columns
    trained = df.filter(pl.col("model") == "agent-001")
    assert trained["step"].unique().sort().to_list() == [0, 1, 2]
    assert trained.group_by("step").agg(pl.col("metric_win").mean()).sort("step")["metric_win"].to_list() == [0.25, 0.5, 0.75]
    assert df["group_number"].n_unique() == 2 * 3 + 1  # one number per (run, split, step, group)
    first = trained.row(0, named=True)
    assert [m["role"] for m in first["messages"]] == ["user", "assistant"]
    assert [m["trainable"] for m in first["messages"]] == [False, True]  # the sampled Choice is trainable
    assert first["messages"][1]["content"] == "ok" and first["logs"] == ["a log line"]
    only = await load_trajectories(PROJECT, models=["gpt-4o"], art_path=store)
    assert only["model"].unique().to_list() == ["gpt-4o"]
    assert (await load_trajectories("no-such-project", art_path=store)).is_empty()


async def test_charts_draw_the_per_step_means(store):
    from matplotlib.figure import Figure

    from groupwise.utils.benchmarking.charts import percentage_comparison_bar_chart, training_progress_chart
    from groupwise.utils.benchmarking.load_trajectories import load_trajectories
    from groupwise.utils.benchmarking.types import BenchmarkModelKey

    df = await load_trajectories(PROJECT, art_path=store)
    keys = [BenchmarkModelKey("gpt-4o", "GPT-4o"), BenchmarkModelKey("agent-001", "Trained")]
    fig = training_progress_chart(df, "win", models=keys, perfect_score=1.0)
    assert isinstance(fig, Figure)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert list(lines["Trained"].get_ydata()) == [0.25, 0.5, 0.75]
    assert list(lines["GPT-4o"].get_ydata()) == [0.5, 0.5] and list(lines["GPT-4o"].get_xdata()) == [0, 2]
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["Trained", "GPT-4o"]
    bars = percentage_comparison_bar_chart(df, "metric_win", models=keys)
    texts = [t.get_text() for t in bars.axes[0].texts]
    assert "50%" in texts and "75%" in texts and "RL +50%" in texts  # 25% at step 0, +50 points by step 2
    with pytest.raises(ConfigError, match="metric_win"):
        training_progress_chart(df, "loss")
    with pytest.raises(ConfigError, match="no rows"):
        training_progress_chart(df, "win", models=[BenchmarkModelKey("agent-001", split="train")])


def test_first_generation_helpers_read_the_store(store, tmp_path):
    from groupwise.utils.benchmarking.generate_comparison_table import generate_comparison_table
    from groupwise.utils.benchmarking.types import BenchmarkedModelKey
    from groupwise.utils.old_benchmarking import generate_line_graphs, load_benchmarked_models

    keys = [BenchmarkedModelKey("agent-001", "val", [0, -1]), BenchmarkedModelKey("gpt-4o", "val")]
    models = load_benchmarked_models(PROJECT, keys, ["win", "reward"], api_path=store)
    assert keys[0].step_indices == [0, -1]  # the caller's keys are not changed
    # a negative index i reads step i - 1 + last, ART's arithmetic (last = 2 here)
    assert [s.index for s in models[0].steps] == [0, 0]
    models = load_benchmarked_models(PROJECT, [BenchmarkedModelKey("agent-001", "val"), keys[1]], ["win", "reward"],
                                     api_path=store)
    assert [s.index for s in models[0].steps] == [0, 1, 2]
    assert models[0].steps[1].metrics["win"] == 0.5 and models[1].steps[0].metrics["reward"] == 0.5
    assert models[0].steps[0].metrics["reward_std_dev"] == 0.25  # groups [0, 0] and [0, 1]
    assert models[0].steps[0].recorded_at is not None
    table = generate_comparison_table(PROJECT, keys, ["win"], api_path=store)
    assert table.to_dict("records")[0] == {"Model": "agent-001", "Split": "val", "Step": "0000", "win": "0.25"}
    paths = generate_line_graphs(PROJECT, [BenchmarkedModelKey("agent-001", "val")], [keys[1]], ["win"],
                                 api_path=store)
    assert len(paths) == 1 and os.path.getsize(paths[0]) > 0 and paths[0].startswith(store)
    with pytest.raises(StoreError, match="stored steps: \\[0, 1, 2\\]"):
        load_benchmarked_models(PROJECT, [BenchmarkedModelKey("agent-001", "val", [7])], api_path=store)
    with pytest.raises(StoreError, match="no 'test' trajectories"):
        load_benchmarked_models(PROJECT, [BenchmarkedModelKey("agent-001", "test")], api_path=store)


async def test_benchmark_rollout_averages_one_group():
    from groupwise.utils.benchmark_rollout import benchmark_rollout

    calls = []

    async def rollout(model: str, index: int, is_validation: bool) -> art.Trajectory:
        calls.append((model, index, is_validation))
        return _trajectory(reward=float(index), win=0.0)

    assert await benchmark_rollout("gpt-4o", 4, rollout) == 1.5
    assert sorted(calls) == [("gpt-4o", i, False) for i in range(4)]


def test_get_repo_root_path_finds_the_programs_repository(tmp_path, monkeypatch):
    from groupwise.utils.get_repo_root_path import get_repo_root_path

    (tmp_path / "repo" / ".git").mkdir(parents=True)
    (tmp_path / "repo" / "src" / "deep").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "repo" / "src" / "deep")
    assert get_repo_root_path() == str(tmp_path / "repo")
    monkeypatch.chdir(tmp_path)
    assert get_repo_root_path() == "."


async def test_skypilot_backend_is_a_local_backend_that_says_so(tmp_path, monkeypatch):
    from groupwise.skypilot import SkyPilotBackend
    from groupwise.skypilot.api import SkyPilotAPI

    env = tmp_path / ".env.cluster"
    env.write_text("GW_SKY_TEST_NEW=from-file\nGW_SKY_TEST_SET=from-file\n")
    monkeypatch.delenv("GW_SKY_TEST_NEW", raising=False)
    monkeypatch.setenv("GW_SKY_TEST_SET", "already")
    with pytest.warns(ArtCompatWarning, match="launches no cluster.*gpu ignored"):
        backend = await SkyPilotBackend.initialize_cluster(cluster_name="art-2048", gpu="H100", env_path=str(env),
                                                           path=str(tmp_path / "runs"))
    assert isinstance(backend, art.LocalBackend) and SkyPilotAPI is SkyPilotBackend
    assert os.environ["GW_SKY_TEST_NEW"] == "from-file" and os.environ["GW_SKY_TEST_SET"] == "already"
    model = art.Model(name="prompted", project=PROJECT)
    await model.register(backend)  # a prompted model needs no engine: registration only names its store
    assert str(tmp_path / "runs") in str(model.store.run_dir)
    await backend.down()


def test_import_loads_the_env_file_as_art_does(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".env").write_text("GW_DOTENV_PROBE=from-dotenv\nGW_DOTENV_KEPT=from-dotenv\n")
    code = "import os, groupwise; print(os.environ.get('GW_DOTENV_PROBE'), os.environ['GW_DOTENV_KEPT'])"
    env = {k: v for k, v in os.environ.items() if k != "GW_DOTENV_PROBE"} | {"GW_DOTENV_KEPT": "mine"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "sub", env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["from-dotenv", "mine"]  # found from a subfolder; a variable already set wins


def _log_runs(store: Path, project: str, runs: dict[str, tuple[str, list[list[float]]]]) -> None:
    """Runs as ART programs leave them: name -> (split, one list of game results per step), each step
    logged as two groups with the results as reward and metrics (`win`, `max_value`, `board_value`)."""
    async def fill():
        for name, (split, steps) in runs.items():
            model = art.Model(name=name, project=project, base_path=str(store))
            for step, results in enumerate(steps):
                half = len(results) // 2
                groups = [art.TrajectoryGroup([art.Trajectory(
                    messages_and_choices=[{"role": "user", "content": "move"}], reward=r,
                    metrics={"win": r, "max_value": 64 * r, "board_value": 100 * r}) for r in part])
                    for part in (results[:half], results[half:])]
                await model.log(groups, split=split, step=step)

    import asyncio

    asyncio.run(fill())


def test_arts_2048_benchmark_notebook(art_model_dir, tmp_path):
    from art_runner import Program, run_program

    _log_runs(tmp_path / "examples/2048/.groupwise", "2048", {
        "003": ("train", [[0, 0, 0, 1], [0, 1, 0, 1], [1, 1, 0, 1]]),
        "gpt-4o": ("val", [[1, 0, 0, 1]]), "gpt-4.1": ("val", [[1, 1, 0, 1]]), "gpt-4o-mini": ("val", [[0, 0, 0, 1]]),
    })
    (tmp_path / ".git").mkdir()  # a checkout of ART: the notebook saves its charts under the repository's root
    run_program(Program("examples/2048/benchmark_2048.ipynb"), tmp_path, art_model_dir)
    charts = tmp_path / "assets/benchmarks/2048"
    assert sorted(p.name for p in charts.iterdir()) == ["accuracy-comparison.svg", "accuracy-training-progress.svg"]
    assert "agent-003" in (charts / "accuracy-training-progress.svg").read_text()


def test_arts_tic_tac_toe_benchmark_notebook(art_model_dir, tmp_path):
    from art_runner import Program, run_program

    _log_runs(tmp_path / "examples/tic_tac_toe/.groupwise", "tic-tac-toe-local", {
        "001-script": ("train", [[0, 0, 1, 0], [1, 0, 1, 1]]), "009": ("train", [[0, 0, 0, 0]]),
        "gpt-4o": ("val", [[1, 0, 1, 0]]), "gpt-4.1": ("val", [[1, 1, 1, 0]]),
    })
    run_program(Program("examples/tic_tac_toe/display-benchmarks.ipynb"), tmp_path, art_model_dir)
    # no repository around the copy: get_repo_root_path() is "." (the notebook's folder), as in a pip install
    charts = tmp_path / "examples/tic_tac_toe/assets/benchmarks/tic-tac-toe-local"
    assert sorted(p.name for p in charts.iterdir()) == ["accuracy-comparison.svg", "accuracy-training-progress.svg"]


def test_arts_first_benchmark_notebook(art_model_dir, tmp_path):
    from art_runner import Program, run_program

    train = [[0, 0, 0, 1], [0, 1, 0, 1], [1, 1, 0, 1], [1, 1, 1, 1]]
    _log_runs(tmp_path / "examples/2048/.groupwise", "2048-dev", {
        **{name: ("train", train) for name in ("009", "010", "011", "012")},
        "gpt-4o-mini": ("val", [[0, 0, 0, 1]]), "gpt-4o": ("val", [[1, 0, 0, 1]]),
    })
    # its table prints with pandas' to_markdown; its graph grid is shown with IPython's display (the seam's)
    run_program(Program("examples/2048/old_benchmark_2048.ipynb"), tmp_path, art_model_dir)
    graphs = sorted((tmp_path / "examples/2048/.groupwise/2048-dev/benchmarks").iterdir())
    assert sorted(p.name.split("_", 2)[-1] for p in graphs) == [
        "board_value_line_graph.png", "max_value_line_graph.png", "reward_line_graph.png", "reward_std_dev_line_graph.png"]


async def test_deployment_names_import_and_say_how_to_serve(tmp_path):
    from groupwise.errors import GroupwiseError
    from groupwise.utils.deploy_model import LoRADeploymentJobStatus, LoRADeploymentProvider
    from groupwise.utils.deployment import TogetherDeploymentConfig, deploy_model

    assert LoRADeploymentProvider.TOGETHER == "together" and LoRADeploymentJobStatus.COMPLETE == "Complete"
    model = art.TrainableModel(name="agent", project=PROJECT, base_model="smollm2-135m", base_path=str(tmp_path))
    with pytest.raises(GroupwiseError, match=r"groupwise serve --model smollm2-135m --adapter .*agent/checkpoints/3"):
        await deploy_model(model=model, checkpoint_path="x", step=3, provider="together",
                           config=TogetherDeploymentConfig())


def test_arts_parquet_trajectory_logs_round_trip(tmp_path):
    from openai.types.chat import ChatCompletionMessageToolCall
    from openai.types.chat.chat_completion_message_tool_call import Function

    from groupwise.utils.trajectory_logging import read_trajectory_groups_parquet, write_trajectory_groups_parquet

    call = ChatCompletionMessageToolCall(id="c1", type="function", function=Function(name="look", arguments='{"q": 1}'))
    choice = Choice(index=0, finish_reason="tool_calls",
                    message=ChatCompletionMessage(role="assistant", content=None, tool_calls=[call]))
    tools = [{"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}]
    first = art.Trajectory(messages_and_choices=[{"role": "user", "content": "find"}, choice,
                                                 {"role": "tool", "tool_call_id": "c1", "content": "found"}],
                           tools=tools, reward=0.5, metrics={"win": 1.0}, metadata={"game": "g"}, logs=["l"])
    groups = [art.TrajectoryGroup([first, _trajectory(0.0, 0.0)], metadata={"scenario": "s1"}, metrics={"m": 2.0},
                                  logs=["group log"]),
              art.TrajectoryGroup([_trajectory(1.0, 1.0)])]
    path = tmp_path / "0000.parquet"
    write_trajectory_groups_parquet(groups, path)
    back = read_trajectory_groups_parquet(path)
    assert [len(g.trajectories) for g in back] == [2, 1]
    assert back[0].metadata == {"scenario": "s1"} and back[0].metrics == {"m": 2.0} and back[0].logs == ["group log"]
    t = back[0].trajectories[0]
    assert (t.reward, t.metrics, t.metadata, t.logs, t.tools) == (0.5, {"win": 1.0}, {"game": "g"}, ["l"], tools)
    # the Choice comes back as its assistant message, tool calls kept (ART's reader does the same)
    assert t.messages_and_choices[1] == {"role": "assistant", "content": None,
                                         "tool_calls": [call.model_dump(mode="json")]}
    assert t.messages_and_choices[2] == {"role": "tool", "content": "found", "tool_call_id": "c1"}
    import polars as pl

    assert pl.read_parquet(path)["messages"].to_list()[0][1]["trainable"] is True


def test_art_0_1_to_0_4s_json_line_logs_round_trip(tmp_path):
    from groupwise.runs.store import RunStore
    from groupwise.utils.trajectory_logging import deserialize_trajectory_groups, serialize_trajectory_groups

    logprob = {"content": [{"token": "ok", "logprob": -0.1, "bytes": [111, 107], "top_logprobs": []}]}
    choice = Choice.model_validate({"index": 0, "finish_reason": "stop", "logprobs": logprob,
                                    "message": {"role": "assistant", "content": "ok"}})
    groups = [art.TrajectoryGroup([art.Trajectory(messages_and_choices=[{"role": "user", "content": "x"}, choice],
                                                  reward=1.0, metrics={"win": 1.0}, logs=["l"])])]
    text = serialize_trajectory_groups(groups)
    assert "logprobs" not in text  # ART wrote its Choices without them
    back = deserialize_trajectory_groups(text)
    got = back[0].trajectories[0]
    assert isinstance(got.messages_and_choices[1], Choice) and got.messages_and_choices[1].message.content == "ok"
    assert (got.reward, got.metrics, got.logs) == (1.0, {"win": 1.0}, ["l"])
    # groupwise's own store lines read the same way (they hold ART's keys and more)
    path = RunStore(str(tmp_path), "p", "m").write_trajectories("train", 0, groups)
    assert deserialize_trajectory_groups(path.read_text())[0].trajectories[0].reward == 1.0
