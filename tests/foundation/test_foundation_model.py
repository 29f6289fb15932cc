"""Model / TrainableModel against a fake Backend: register, client, train + log, history rows."""

from __future__ import annotations

import json

import httpx
import pytest

from groupwise import Backend, GroupwiseError, Model, TrainableModel, Trajectory, TrajectoryGroup, load_history, load_trajectories
from groupwise.backend.base import InferenceEndpoint, TrainResult
from groupwise.config import TrainConfig


def chat_handler(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    return httpx.Response(200, json={
        "id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [1, 2],
                     "message": {"role": "assistant", "content": f"hello from {body['model']}"}}],
    })


class FakeBackend(Backend):
    def __init__(self):
        self.steps: dict[str, int] = {}
        self.trained: list[tuple[int, TrainConfig]] = []

    async def register(self, model):
        self.steps[model.name] = 0

    def inference_endpoint(self, model):
        return InferenceEndpoint(base_url="http://in-process/v1", api_key="k",
                                 http_client=httpx.AsyncClient(transport=httpx.MockTransport(chat_handler)))

    async def train(self, model, groups, config):
        self.trained.append((len(groups), config))
        self.steps[model.name] += 1
        return TrainResult(step=self.steps[model.name], metrics={"loss": 0.5, "reward": 9.0, "note": "x"})

    async def get_step(self, model):
        return self.steps[model.name]


def groups():
    def t(r):
        return Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=r)

    return [TrajectoryGroup([t(1.0), t(0.0)]), TrajectoryGroup([t(0.5), t(0.5)])]


async def test_trainable_model_register_client_train_and_log(tmp_path):
    model = TrainableModel(name="agent-001", project="2048", base_model="tiny", base_path=str(tmp_path))
    with pytest.raises(GroupwiseError, match="not registered"):
        await model.get_step()
    backend = FakeBackend()
    await model.register(backend)
    assert await model.get_step() == 0
    assert model.inference_name() == "agent-001" and model.inference_name(3) == "agent-001@3"

    client = model.openai_client()
    assert client is model.openai_client()  # cached
    reply = await client.chat.completions.create(model=model.inference_name(), messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "hello from agent-001"
    assert reply.choices[0].token_ids == [1, 2]

    result = await model.train(groups(), config=TrainConfig(learning_rate=2e-5))
    assert result.step == 1 and await model.get_step() == 1
    assert backend.trained[0][0] == 2 and backend.trained[0][1].learning_rate == 2e-5
    # The train split is logged at the step that sampled the rollouts (0), with the trainer's metrics;
    # the trainer's "reward" would clash with the row's own field, so it is renamed.
    [row] = load_history(model.run_dir)
    assert (row["step"], row["split"], row["loss"], row["train_reward"]) == (0, "train", 0.5, 9.0)
    assert row["reward"] == 0.5 and "note" not in row      # (1 + 0 + 0.5 + 0.5) / 4
    assert load_trajectories(model.run_dir, split="train", step=0) == groups()

    await model.log(groups(), split="val")  # step defaults to the current step
    rows = load_history(model.run_dir)
    assert [(r["step"], r["split"]) for r in rows] == [(0, "train"), (1, "val")]
    await model.close()


async def test_prompted_model_logs_at_step_zero(tmp_path):
    model = Model(name="gpt-4o-mini", project="2048", base_path=str(tmp_path),
                  inference_base_url="http://x/v1", inference_api_key="k", inference_model_name="openai/gpt-4o-mini")
    assert model.inference_name() == "openai/gpt-4o-mini"
    assert str(model.openai_client().base_url) == "http://x/v1/"
    flat = [t for g in groups() for t in g.trajectories]
    row = await model.log(flat, split="val", metrics={"cost": 0.01})
    assert row["step"] == 0 and row["n_groups"] == 1 and row["cost"] == 0.01
    assert model.run_dir == tmp_path / "2048" / "models" / "gpt-4o-mini"
    assert load_trajectories(model.run_dir)[0].trajectories == flat


async def test_log_rejects_unrun_groups_and_bad_metrics(tmp_path):
    model = Model(name="m", project="p", base_path=str(tmp_path))

    async def rollout():
        return Trajectory(messages_and_choices=[{"role": "user", "content": "x"}])

    coro = rollout()
    with pytest.raises(GroupwiseError, match="never run"):
        await model.log([TrajectoryGroup([coro])])
    coro.close()
    with pytest.raises(TypeError, match=r"metrics\['acc'\]"):
        await model.log(None, metrics={"acc": "high"})


def test_trainable_model_name_must_be_a_folder_name(tmp_path):
    with pytest.raises(GroupwiseError, match="model name='a/b'"):
        TrainableModel(name="a/b", project="p", base_model="tiny", base_path=str(tmp_path))


def test_models_are_pydantic_models_generic_in_their_config(tmp_path):
    from pydantic import BaseModel

    class MyConfig(BaseModel):
        difficulty: int = 1

    model = TrainableModel[MyConfig](name="agent", project="p", base_model="tiny", base_path=tmp_path,
                                     config={"difficulty": 3})
    assert isinstance(model.config, MyConfig) and model.config.difficulty == 3  # validated as MyConfig
    assert model.base_path == str(tmp_path)
    dumped = model.model_dump()
    assert (dumped["name"], dumped["trainable"], dumped["config"]) == ("agent", True, {"difficulty": 3})
    baseline = Model[MyConfig](name="baseline", project="p", config=MyConfig(), inference_api_key="sk-secret")
    assert baseline.model_dump()["trainable"] is False
    assert "sk-secret" not in f"{baseline} {baseline!r} {model}"  # printing a model never shows its key
    with pytest.raises(GroupwiseError, match="difficulty"):
        TrainableModel[MyConfig](name="agent", project="p", config={"difficulty": "hard"})
    with pytest.raises(GroupwiseError, match="bogus"):  # an argument neither side knows names itself
        Model(name="m", project="p", bogus=1)


async def test_model_copy_keeps_the_registration_and_copies_the_settings(tmp_path):
    internal = {"trainer_args": {"max_grad_norm": 0.1}}
    model = TrainableModel(name="agent", project="p", base_model="tiny", base_path=str(tmp_path),
                           _internal_config=internal)
    backend = FakeBackend()
    await model.register(backend)
    model.openai_client()
    clone = model.model_copy(deep=True)
    assert clone.backend is backend and clone.name == "agent" and clone.run_dir == model.run_dir
    assert clone._internal_config == internal and clone._internal_config is not internal
    assert clone.openai_client() is not model.openai_client()  # its own connection pool
    renamed = model.model_copy(update={"name": "agent-2"})
    assert renamed.run_dir == tmp_path / "p" / "models" / "agent-2" and model.run_dir == tmp_path / "p" / "models" / "agent"
    await model.close()
    await clone.close()


async def test_arts_trainer_args_set_the_steps_train_config(tmp_path):
    # ART's trainer reads max_grad_norm (and weight_decay, seed) from _internal_config's trainer_args
    model = TrainableModel(name="agent", project="p", base_model="tiny", base_path=str(tmp_path),
                           _internal_config={"trainer_args": {"max_grad_norm": 0.1, "weight_decay": 0.01},
                                             "init_args": {"max_seq_length": 8192}})
    backend = FakeBackend()
    await model.register(backend)
    await model.train(groups(), config=TrainConfig(learning_rate=2e-5))
    await model.train(groups(), config=TrainConfig(max_grad_norm=0.5), _config={"max_seq_len": 512})
    first, second = backend.trained[0][1], backend.trained[1][1]
    assert (first.max_grad_norm, first.weight_decay, first.max_seq_len, first.learning_rate) == (0.1, 0.01, 8192, 2e-5)
    assert (second.max_grad_norm, second.weight_decay, second.max_seq_len) == (0.5, 0.01, 512)  # the step's own win


def test_run_state_as_arts_methods(tmp_path):
    model = Model(name="m", project="p", base_path=str(tmp_path))
    assert model.read_state() is None  # nothing written yet, as ART's
    assert model.merge_state({"data": {"offset": 1}, "best": 0.5}) == {"data": {"offset": 1}, "best": 0.5}
    assert model.merge_state({"data": {"epoch": 2}}) == {"data": {"offset": 1, "epoch": 2}, "best": 0.5}  # deep
    model.overwrite_state({"c": 3})
    assert model.read_state() == {"c": 3} == model.store.read_state()
    model.write_state({"d": 4})
    assert model.read_state() == {"d": 4}


async def test_train_takes_groups_as_lists_of_trajectories_by_arts_keyword(tmp_path):
    """ART iterates whatever groups it is given: its hn_title_generator trains on lists of the
    trajectories it kept (`model.train(valid_train_groups)`), and its notebooks pass the groups as
    `trajectory_groups=`. Anything else is still a TypeError naming the group."""
    model = TrainableModel(name="agent", project="p", base_model="tiny", base_path=str(tmp_path))
    await model.register(FakeBackend())
    await model.train(trajectory_groups=[list(g) for g in groups()])
    assert load_trajectories(model.run_dir, split="train", step=0) == groups()
    with pytest.raises(TypeError, match=r"groups\[1\] is dict"):
        await model.train([groups()[0], {"trajectories": []}])
    await model.close()


async def test_log_refuses_a_step_or_metric_no_reader_can_use(tmp_path):
    # A metrics-only log took step="5", 5.7 (as 5) and -1 (int(step)); a metric of 10**400 was written
    # and made `groupwise report` and the dashboard crash on the run (OverflowError in float()).
    model = Model(name="m", project="p", base_path=str(tmp_path))
    for step in (-1, "5", 5.7, True):
        with pytest.raises(GroupwiseError, match="must be an int >= 0"):
            await model.log(None, metrics={"acc": 1.0}, step=step)
    with pytest.raises(GroupwiseError, match="past float's range"):
        await model.log(None, metrics={"acc": 10**400}, step=1)
    import numpy as np

    row = await model.log(None, metrics={"acc": 10**300}, step=np.int64(2))
    assert row["step"] == 2 and load_history(model.run_dir) == [row]
    deep: dict = {}
    for _ in range(5000):  # its repr in the error message recursed past the limit (RecursionError)
        deep = {"a": deep}
    with pytest.raises(GroupwiseError, match="must be a number"):
        await model.log(None, metrics={"acc": deep}, step=3)
