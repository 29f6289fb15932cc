"""ART 0.3 - 0.5.17 programs (the tic-tac-toe and 2048 examples, the yes-no-maybe script), written as
ART's examples are, run unchanged but for `import groupwise as art`, on the tiny random model.

Each runs at least two training steps and one step whose groups all tie (ART skips it and goes on;
so does groupwise, with a warning and a record). The game logic is shortened; the ART idioms are not.
"""

from __future__ import annotations

import asyncio
import math
import random

import openai
import pytest
from pydantic import BaseModel

import groupwise as art  # the only change an ART program needs
from groupwise.local import LocalBackend  # ART: from art.local import LocalBackend

# ---------------------------------------------------------------- tic-tac-toe (examples/tic_tac_toe)


class TicTacToeScenario(BaseModel):
    step: int


@art.retry(exceptions=(openai.LengthFinishReasonError,))
async def ttt_rollout(model: art.Model, scenario: TicTacToeScenario) -> art.Trajectory:
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "system", "content": "You are a tic-tac-toe player. Answer <move>A1</move>."}],
        reward=0,
    )
    move_number = 0
    for _ in range(2):
        trajectory.messages_and_choices.append({"role": "user", "content": ". . .\n. x .\n. . ."})
        client = model.openai_client()
        chat_completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=trajectory.messages(), max_completion_tokens=6,
        )
        choice = chat_completion.choices[0]
        content = choice.message.content
        assert isinstance(content, str)
        trajectory.messages_and_choices.append(choice)
        move_number += 1
    # step 1's board is already decided: every game ends in a draw, so every reward ties
    if scenario.step == 1:
        trajectory.reward = 0.5
        trajectory.metrics["win"] = 0.5
    else:
        trajectory.reward = (len(content) % 5) / 4 + math.log(move_number + 1) / math.log(100)
        trajectory.metrics["win"] = 1 if trajectory.reward > 0.5 else 0
    trajectory.metrics["num_moves"] = move_number
    return trajectory


async def tic_tac_toe_main(path: str, base_model: str) -> art.TrainableModel:
    backend = LocalBackend(path=path)
    model = art.TrainableModel(name="llama-8b-007", project="tic-tac-toe", base_model=base_model)
    await backend._experimental_pull_from_s3(model)
    await model.register(backend)
    for i in range(await model.get_step(), 3):
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(ttt_rollout(model, TicTacToeScenario(step=i)) for _ in range(4)) for _ in range(2)),
            pbar_desc="gather",
        )
        await model.delete_checkpoints()
        await model.train(train_groups, config=art.TrainConfig(learning_rate=5e-5))
        await backend._experimental_push_to_s3(model)
    await backend.close()
    return model


async def test_tic_tac_toe_example(tiny_model_dir, tmp_path, backup_bucket, caplog):
    model = await tic_tac_toe_main(str(tmp_path / ".art"), tiny_model_dir)
    run = tmp_path / ".art" / "tic-tac-toe" / "models" / "llama-8b-007"
    history = art.load_history(run)
    train = [r for r in history if r["split"] == "train"]
    # three steps as ART counts them: step 1 tied and was skipped, yet the counter went on
    assert [r["step"] for r in train] == [0, 1, 2]
    assert [r["skipped"] for r in train] == [0.0, 1.0, 0.0]
    alerts = [r for r in history if r["split"] == "alert" and r["name"] == "no_signal"]
    assert [(a["step"], a["action"]) for a in alerts] == [(1, "skip")]
    assert "step 1 skipped" in caplog.text and "group 0: [0.5, 0.5, 0.5, 0.5]" in caplog.text
    # delete_checkpoints kept the latest; the backup folder mirrors the run (ART's S3 layout)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0003"]
    mirrored = backup_bucket / "tic-tac-toe" / "models" / "llama-8b-007"
    assert (mirrored / "checkpoints" / "0003" / "state.json").is_file()
    assert (mirrored / "history.jsonl").read_text() == (run / "history.jsonl").read_text()
    # a fresh machine pulls the backup and resumes at step 3
    fresh = tmp_path / "fresh"
    resumed = art.TrainableModel(name="llama-8b-007", project="tic-tac-toe", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(fresh))
    await backend._experimental_pull_from_s3(resumed)
    await resumed.register(backend)
    assert await resumed.get_step() == 3
    await backend.close()


# ---------------------------------------------------------------- 2048 (examples/2048)


@art.retry(exceptions=(openai.LengthFinishReasonError,))
async def game_rollout(model: art.Model, step: int, is_validation: bool) -> art.Trajectory:
    trajectory = art.Trajectory(
        messages_and_choices=[{"role": "system", "content": "You are an excellent 2048 player. <move>left</move>"}],
        reward=0,
    )
    trajectory.messages_and_choices.append({"role": "user", "content": "2 . . .\n. . . .\n. . 2 .\n. . . ."})
    client = model.openai_client()
    chat_completion = await client.chat.completions.create(
        max_completion_tokens=6, messages=trajectory.messages(), model=model.name,
    )
    choice = chat_completion.choices[0]
    content = choice.message.content
    assert isinstance(content, str)
    trajectory.messages_and_choices.append(choice)
    if step == 0 and random.random() < 0.1:
        raise RuntimeError("the game server dropped the connection")  # within max_exceptions
    if step == 1:
        trajectory.reward = -1  # every move of this step is invalid: all rewards tie
        return trajectory
    max_value = 2 ** (1 + len(content) % 4)
    trajectory.metrics["max_value"] = max_value
    trajectory.reward = (math.log(max_value, 2) - 1) / (math.log(2048, 2) - 1)
    return trajectory


async def game_2048_main(path: str, base_model: str) -> None:
    model = art.TrainableModel(name="003", project="2048", base_model=base_model)
    model._internal_config = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=8192),
        engine_args=art.dev.EngineArgs(enforce_eager=True, gpu_memory_utilization=0.8),
    )
    backend = LocalBackend(path=path)
    await backend._experimental_pull_from_s3(model, verbose=True)
    await model.register(backend)
    for i in range(await model.get_step(), 3):
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(game_rollout(model, i, is_validation=False) for _ in range(4)) for _ in range(2)),
            pbar_desc="gather",
            max_exceptions=10,
        )
        await model.delete_checkpoints()
        await backend._experimental_push_to_s3(model)
        await model.train(
            train_groups,
            config=art.TrainConfig(learning_rate=3e-5),
            _config={"logprob_calculation_chunk_size": 8},
        )
    await backend.close()


async def test_2048_example(tiny_model_dir, tmp_path, backup_bucket, recwarn):
    random.seed(0)
    await game_2048_main(str(tmp_path / ".art"), tiny_model_dir)
    history = art.load_history(tmp_path / ".art" / "2048" / "models" / "003")
    train = [r for r in history if r["split"] == "train"]
    assert [(r["step"], r["skipped"]) for r in train] == [(0, 0.0), (1, 1.0), (2, 0.0)]
    assert train[0]["max_value"] >= 2
    # the vLLM settings had no effect, and one warning named them; init_args' max_seq_length is applied
    named = [str(w.message) for w in recwarn if issubclass(w.category, art.ArtCompatWarning)]
    assert any("engine_args.enforce_eager, engine_args.gpu_memory_utilization" in m for m in named), named
    assert not any("max_seq_length" in m for m in named), named


# ---------------------------------------------------------------- yes-no-maybe (dev/yes-no-maybe.py)


async def ynm_rollout(client: openai.AsyncOpenAI, prompt: str) -> art.Trajectory:
    messages: art.Messages = [{"role": "user", "content": prompt}]
    chat_completion = await client.chat.completions.create(messages=messages, model=model.name, max_tokens=4, timeout=100)
    choice = chat_completion.choices[0]
    content = choice.message.content
    assert isinstance(content, str)
    if content == "yes":
        reward = 0.5
    elif content == "no":
        reward = 0.75
    elif content == "maybe":
        reward = 1.0
    else:
        reward = 0.0 if prompt.startswith("just") else len(content) / 10  # (the random model never says yes)
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=reward)


model: art.TrainableModel


async def yes_no_maybe_main(path: str, base_model: str, prompts_per_step: list[list[str]]) -> None:
    backend = LocalBackend(path=path)
    global model
    model = art.TrainableModel(
        name="012",
        project="yes-no-maybe",
        base_model=base_model,
        _internal_config=art.dev.InternalModelConfig(
            tinker_args=art.dev.TinkerArgs(
                renderer_name="qwen3_instruct",
                training_client_args=art.dev.TinkerTrainingClientArgs(rank=1),
            ),
        ),
    )
    await model.register(backend)
    openai_client = model.openai_client()
    start_step = await model.get_step()
    for prompts in prompts_per_step[start_step:]:
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(ynm_rollout(openai_client, prompt) for _ in range(4)) for prompt in prompts)
        )
        await model.train(train_groups, config=art.TrainConfig(learning_rate=1e-4))
    await backend.close()


async def test_yes_no_maybe_script(tiny_model_dir, tmp_path):
    steps = [["respond with 'yes', 'no', 'maybe'"], ["just respond with yes or no"], ["respond with maybe"]]
    await yes_no_maybe_main(str(tmp_path), tiny_model_dir, steps)
    train = [r for r in art.load_history(tmp_path / "yes-no-maybe" / "models" / "012") if r["split"] == "train"]
    assert [(r["step"], r["skipped"]) for r in train] == [(0, 0.0), (1, 1.0), (2, 0.0)]
    assert all(r["loss"] == r["loss"] for r in train if not r["skipped"])  # real steps report a loss
