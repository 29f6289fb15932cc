"""An ART 0.1-0.2 program (the `LocalAPI` era, before ART 0.3 renamed it `LocalBackend`): `art.LocalAPI`,
`model.register(api)`, a prompted model given `base_url=` / `api_key=`, `model.api()`,
`iterate_dataset(batch_size=)` and its tuples, `model.base_url` / `model.api_key` read after `register`
by a plain `openai` client over HTTP. Unchanged but for `import groupwise as art`; tiny random model."""

from __future__ import annotations

import openai
import pytest

import groupwise as art  # the only change an ART program needs
from groupwise.utils import iterate_dataset

SCENARIOS = [{"a": 1, "b": 2}, {"a": 2, "b": 3}, {"a": 3, "b": 4}, {"a": 4, "b": 5}]


async def rollout(model: art.Model, scenario: dict) -> art.Trajectory:
    client = openai.AsyncOpenAI(base_url=model.base_url, api_key=model.api_key)  # ART 0.1's field names
    messages = [{"role": "user", "content": f"What is {scenario['a']} + {scenario['b']}?"}]
    async with client:
        completion = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=4)
    choice = completion.choices[0]
    return art.Trajectory(messages_and_choices=[*messages, choice], reward=float(len(choice.message.content or "") % 3))


async def main(path: str, base_model: str) -> art.TrainableModel:
    api = art.LocalAPI(path=path)
    model = art.TrainableModel(name="adder", project="math", base_model=base_model)
    await model.register(api)
    assert model.api() is api
    for batch, epoch, global_step, epoch_step in iterate_dataset(SCENARIOS, batch_size=2,
                                                                 initial_step=await model.get_step()):
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(model, scenario) for _ in range(4)) for scenario in batch)
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-4))
    return model


async def test_an_art_0_1_program_runs_with_only_the_import_changed(tiny_model_dir, tmp_path):
    model = await main(str(tmp_path), tiny_model_dir)
    try:
        assert await model.get_step() == 2  # two batches of two scenarios
        assert model.base_url == model.inference_base_url and model.base_url.startswith("http://127.0.0.1:")
        assert model.api_key == model.inference_api_key
    finally:
        await model.api().close()


async def test_a_prompted_model_takes_arts_0_1_endpoint_fields(tmp_path):
    gpt = art.Model(name="gpt-4o", project="math", base_url="https://example.invalid/v1", api_key="sk-test")
    assert (gpt.inference_base_url, gpt.inference_api_key) == ("https://example.invalid/v1", "sk-test")
    gpt.base_url = "http://127.0.0.1:9/v1"  # written through, as ART 0.1's field
    assert gpt.inference_base_url == "http://127.0.0.1:9/v1" and "base_url" not in gpt.model_dump()
    await gpt.register(api=art.LocalAPI(path=str(tmp_path)))  # ART 0.1's keyword
    assert isinstance(gpt.api(), art.LocalBackend) and art.API is art.Backend
    with pytest.raises(art.ConfigError, match="name the same setting"):
        art.Model(name="m", base_url="http://a/v1", inference_base_url="http://b/v1")
    with pytest.raises(art.ConfigError, match="name the same setting"):
        list(iterate_dataset(SCENARIOS, 3, batch_size=2, use_tqdm=False))
    with pytest.raises(art.GroupwiseError, match="takes one backend"):
        await gpt.register()


async def test_an_art_0_1_1x_program_gets_its_model_from_the_api(tiny_model_dir, tmp_path):
    """ART 0.1.1-0.1.22 (e.g. dev/yes-no-maybe.ipynb and examples/2048/2048.ipynb before 1daf4a9): no
    TrainableModel yet; ``await api.get_or_create_model(name=, project=, base_model=, _config=
    art.dev.ModelConfig(...))`` gives the registered model, and ``await model.openai_client()`` its
    client. 0.1.1-0.1.9 took no project: ``(name, base_model)``."""
    api = art.LocalAPI(path=str(tmp_path))
    model = await api.get_or_create_model(
        name="001", project="yes-no-maybe", base_model=tiny_model_dir,
        _config=art.dev.ModelConfig(init_args=art.dev.InitArgs(max_seq_length=2048)))
    try:
        openai_client = await model.openai_client()
        assert openai_client is model.openai_client()

        async def rollout(client, prompt: str) -> art.Trajectory:
            messages = [{"role": "user", "content": prompt}]
            completion = await client.chat.completions.create(messages=messages, model=model.name, max_tokens=4)
            choice = completion.choices[0]
            return art.Trajectory(messages_and_choices=[*messages, choice],
                                  reward=float(len(choice.message.content or "") % 3))

        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(rollout(openai_client, p) for _ in range(4)) for p in ("yes or no?", "maybe?"))
        await model.train(groups, config=art.TrainConfig(learning_rate=1e-4))
        assert await model.get_step() == 1
        assert (tmp_path / "yes-no-maybe" / "models" / "001" / "checkpoints").is_dir()
        old = await api.get_or_create_model("002", tiny_model_dir)  # ART 0.1.1-0.1.9's (name, base_model)
        assert (old.base_model, old.project, await old.get_step()) == (tiny_model_dir, "default", 0)
    finally:
        await api.close()


def test_art_0_1_1_to_0_1_9s_local_api_takes_its_wandb_settings(tmp_path):
    """ART 0.1.1-0.1.9: ``art.LocalAPI(wandb_entity=..., wandb_project=...)`` (tic-tac-toe-unsloth.ipynb):
    W&B settings, accepted and named in a warning (it was an unknown-argument ConfigError)."""
    with pytest.warns(art.ArtCompatWarning, match="wandb_entity, wandb_project"):
        api = art.LocalAPI(path=str(tmp_path), wandb_entity="me", wandb_project="agent-reinforcement-training")
    assert api.path == str(tmp_path)
