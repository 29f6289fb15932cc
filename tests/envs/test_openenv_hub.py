"""gw.envs.from_openenv against a real OpenEnv server: the vowel env (`openenv_vowels/`, laid out as
`openenv init` lays one out) served by OpenEnv's own create_app under uvicorn, as its users start it, and
driven through its typed client; gw.fit trains the tiny random model on it."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

pytest.importorskip("openenv.core", reason="the openenv extra (openenv-core) is not installed")

import groupwise as gw  # noqa: E402
from groupwise.runs.series import rows  # noqa: E402
from openenv_vowels import VowelAction, VowelEnv  # noqa: E402
from openenv_vowels.models import vowel_share  # noqa: E402
from served_app import uvicorn_app  # noqa: E402


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    with uvicorn_app("openenv_vowels.server.app:app", tmp_path_factory.mktemp("openenv") / "server.log") as url:
        yield url


def _vowel(scenario) -> str:
    return random.Random(scenario.reset["seed"]).choice("aeiou")  # what the env's reset draws


async def _registered(tiny_model_dir, tmp_path, name):
    model = gw.TrainableModel(name=name, project="openenv", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    return model, backend


async def test_an_openenv_env_trains_two_steps_each_episode_a_trajectory(tiny_model_dir, tmp_path, server_url):
    spec = gw.envs.from_openenv(VowelEnv, base_url=server_url, max_turns=4, system_prompt="Write text.")
    train, val, test = spec.scenarios(0, max_tokens=8)
    assert {s.reset["seed"] for s in val + test}.isdisjoint({s.reset["seed"] for s in train})
    model, backend = await _registered(tiny_model_dir, tmp_path, "vowels")
    config = gw.LoopConfig(rollouts_per_group=3, groups_per_step=2, max_steps=2, eval_every=100, patience=10,
                           resample_no_signal=1)
    try:
        trajectory = await spec.rollout(model, val[0])
        summary = await gw.fit(model, spec.rollout, train, config=config)
    finally:
        await backend.close()
    # one episode: the reset observation, then each reply (the Choice) and the step's observation, until done
    messages = trajectory.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert json.loads(messages[1]["content"]) == {"instruction": f"Write text with as many letters "
                                                                 f"'{_vowel(val[0])}' as you can.", "vowel_count": 0}
    replies = [c.message.content or "" for c in trajectory.messages_and_choices if not isinstance(c, dict)]
    assert len(replies) == 2  # the env said done after two steps, before max_turns
    assert json.loads(messages[3]["content"])["vowel_count"] == replies[0].lower().count(_vowel(val[0]))
    assert trajectory.reward == pytest.approx(sum(vowel_share(r, _vowel(val[0])) for r in replies))
    assert trajectory.metrics == {"env_return": pytest.approx(trajectory.reward), "turns": 2.0, "done": 1.0,
                                  "truncated": 0.0}
    assert summary.final_step == 2
    steps = rows(gw.load_history(summary.run_dir), "train")
    assert [r["step"] for r in steps] == [0, 1] and any(r["skipped"] == 0.0 for r in steps)
    assert all(any("env_return" in key for key in r) and any("turns" in key for key in r) for r in steps)


async def test_max_turns_cuts_an_episode_as_truncated_and_a_client_instance_runs_its_episodes_in_turn(
        tiny_model_dir, tmp_path, server_url):
    model, backend = await _registered(tiny_model_dir, tmp_path, "cut")
    try:
        cut = gw.envs.from_openenv(VowelEnv, base_url=server_url, max_turns=1, reward="last")
        scenario = cut.scenarios(0, max_tokens=4)[1][0]
        trajectory = await cut.rollout(model, scenario)
        assert [m["role"] for m in trajectory.messages()] == ["system", "user", "assistant"]
        assert trajectory.metrics["truncated"] == 1.0 and trajectory.metrics["done"] == 0.0
        # one client is one session: a group's episodes on it take turns, each one from its own reset
        shared = VowelEnv(base_url=server_url)
        spec = gw.envs.from_openenv(shared, max_turns=2)
        scenarios = spec.scenarios(0, max_tokens=4)[1][:3]
        episodes = await asyncio.gather(*(spec.rollout(model, s) for s in scenarios))
        assert [t.metrics["turns"] for t in episodes] == [2.0, 2.0, 2.0]
        for episode, s in zip(episodes, scenarios):
            assert f"'{_vowel(s)}'" in episode.messages()[1]["content"]
        await shared.close()
    finally:
        await backend.close()


def test_an_action_without_one_text_field_asks_for_action_and_a_sync_client_is_refused(server_url):
    from openenv.core import EnvClient
    from openenv.core.env_server.types import State

    from openenv_vowels import VowelObservation

    class Pair(VowelAction):
        other: str

    class PairEnv(EnvClient[Pair, VowelObservation, State]):  # an Action of two text fields
        _step_payload = VowelEnv._step_payload
        _parse_result = VowelEnv._parse_result
        _parse_state = VowelEnv._parse_state

    with pytest.raises(gw.errors.ArgumentTypeError, match="pass action="):
        gw.envs.from_openenv(PairEnv, base_url=server_url)
    spec = gw.envs.from_openenv(PairEnv, base_url=server_url, action=lambda text: Pair(message=text, other=""))
    assert spec.name == "openenv:PairEnv"
    factory = gw.envs.from_openenv(lambda: VowelEnv(base_url=server_url))  # its clients' class names the Action
    assert factory.name == "openenv:VowelEnv"
    with pytest.raises(gw.errors.ArgumentTypeError, match="needs base_url="):
        gw.envs.from_openenv(VowelEnv)
    with pytest.raises(gw.errors.ArgumentTypeError, match="async EnvClient"):
        gw.envs.from_openenv(VowelEnv(base_url=server_url).sync())
