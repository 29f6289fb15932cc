"""gw.envs.from_openenv on an OpenEnv MCP tool environment: the adder env (`openenv_adder/`, an MCPEnvironment
with FastMCP tools, written as OpenEnv's own MCP envs are) served by OpenEnv's create_app under uvicorn and
driven through its MCPToolClient; a scripted model runs the protocol's cases, and gw.fit trains the tiny
random model on it."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("openenv.core.mcp_client", reason="openenv (0.10, the openenv extra) is not installed")

import groupwise as gw  # noqa: E402
from groupwise.core.choices import choice_logprobs, choice_token_ids  # noqa: E402
from groupwise.runs.series import rows  # noqa: E402
from openenv_adder import AdderEnv  # noqa: E402
from openenv_adder.server.adder_environment import closeness, operands  # noqa: E402
from served_app import uvicorn_app  # noqa: E402


@pytest.fixture(scope="module")
def server_url(tmp_path_factory):
    """The adder env's server, started as its users start it (uvicorn on the app module)."""
    with uvicorn_app("openenv_adder.server.app:app", tmp_path_factory.mktemp("openenv-mcp") / "server.log") as url:
        yield url


def _question(scenario) -> tuple[int, int]:
    return operands(scenario.reset["seed"])  # what the env's reset draws


async def test_a_scripted_episode_runs_the_mcp_protocol(server_url, scripted):
    spec = gw.envs.from_openenv(AdderEnv, base_url=server_url, max_turns=4, system_prompt="Add.")
    scenario = spec.scenarios(0)[1][0]
    a, b = _question(scenario)
    model = scripted([{"tool_calls": [("add", {"a": a, "b": b}), ("add", [a, b])]},  # the 2nd call's arguments: a list
                      {"tool_calls": [("nope", {})]},
                      {"tool_calls": [("submit_answer", {"answer": a + b + 1})]}])
    trajectory = await spec.rollout(model, scenario)
    messages = trajectory.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool",
                                             "assistant", "tool"]
    assert messages[1]["content"] == f"What is {a} + {b}?"  # the reset observation's metadata
    # the tools the env lists, as OpenAI tools with the MCP input schema, in every request
    assert [t["function"]["name"] for t in model.requests[0]["tools"]] == ["add", "submit_answer"]
    assert model.requests[0]["tools"][0]["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert "tool_choice" not in model.requests[0]
    calls = messages[2]["tool_calls"]
    assert messages[3] == {"role": "tool", "tool_call_id": calls[0]["id"], "content": str(a + b)}  # the tool's output
    assert messages[4]["tool_call_id"] == calls[1]["id"]
    assert messages[4]["content"] == "Error: could not call add: the arguments are a JSON list, not an object."
    assert messages[6]["content"].startswith("Error (tool_not_found): ") and "nope" in messages[6]["content"]
    assert messages[8]["content"] == f"submitted {a + b + 1}"
    assert trajectory.reward == pytest.approx(0.5)  # the submit step's reward: 1 / (1 + |off by one|)
    assert trajectory.metrics == {"env_return": pytest.approx(0.5), "turns": 3.0, "done": 1.0, "truncated": 0.0,
                                  "tool_calls": 3.0, "tool_errors": 2.0, "answered": 0.0}
    choice = trajectory.messages_and_choices[2]
    assert not isinstance(choice, dict) and choice_token_ids(choice) == [100]


async def test_a_reply_without_a_tool_call_ends_the_episode_or_is_submitted_as_the_answer(server_url, scripted):
    spec = gw.envs.from_openenv(AdderEnv, base_url=server_url, max_turns=4)
    scenario = spec.scenarios(0)[1][1]
    a, b = _question(scenario)
    plain = await spec.rollout(scripted([str(a + b)]), scenario)
    assert [m["role"] for m in plain.messages()] == ["system", "user", "assistant"]
    assert plain.reward == 0.0 and plain.metrics["answered"] == 1.0 and plain.metrics["truncated"] == 0.0
    assert plain.messages()[0]["content"] == gw.envs.openenv_mcp.DEFAULT_MCP_SYSTEM_PROMPT
    answering = gw.envs.from_openenv(AdderEnv, base_url=server_url, answer_tool="submit_answer", tool_choice="auto")
    model = scripted([str(a + b)])
    submitted = await answering.rollout(model, scenario)
    assert model.requests[0]["tool_choice"] == "auto"
    assert submitted.reward == 1.0 and submitted.metrics["done"] == 1.0 and submitted.metrics["tool_calls"] == 1.0
    # a reply cut at max_tokens (a call or an answer cut short) is no answer: truncated, nothing submitted
    model = scripted([{"cut": '<tool_call>{"name": "add", "argu'}])
    cut_short = await answering.rollout(model, scenario)
    assert cut_short.metrics["truncated"] == 1.0 and cut_short.metrics["answered"] == 0.0
    assert cut_short.metrics["tool_calls"] == 0.0 and cut_short.reward == 0.0 and len(model.requests) == 1
    # max_turns replies of tool calls that do not end it: truncated
    cut = gw.envs.from_openenv(AdderEnv, base_url=server_url, max_turns=2)
    looping = await cut.rollout(scripted([{"tool_calls": [("add", {"a": 1, "b": 2})]}] * 2), scenario)
    assert [m["content"] for m in looping.messages() if m["role"] == "tool"] == ["3", "3"]
    assert looping.metrics["truncated"] == 1.0 and looping.metrics["done"] == 0.0 and looping.reward == 0.0
    # a client instance is one session: a group's episodes on it take turns, each one from its own reset
    shared = AdderEnv(base_url=server_url)
    spec = gw.envs.from_openenv(shared, max_turns=2)
    scenarios = spec.scenarios(0)[1][:3]
    model = scripted(lambda body: {"tool_calls": [("submit_answer", {"answer": sum(_question(scenarios[0]))})]})
    episodes = await asyncio.gather(*(spec.rollout(model, s) for s in scenarios))
    assert [e.messages()[1]["content"] for e in episodes] == [f"What is {a} + {b}?" for a, b in map(_question, scenarios)]
    assert episodes[0].reward == 1.0 and all(e.metrics["done"] == 1.0 for e in episodes)
    await shared.close()


def test_mcp_settings_are_checked(server_url):
    with pytest.raises(gw.errors.ArgumentTypeError, match="action= does not apply"):
        gw.envs.from_openenv(AdderEnv, base_url=server_url, action=lambda text: text)
    from openenv_vowels import VowelEnv

    with pytest.raises(gw.errors.ArgumentTypeError, match="for OpenEnv's MCP tool clients"):
        gw.envs.from_openenv(VowelEnv, base_url=server_url, tool_choice="required")
    spec = gw.envs.from_openenv(lambda: AdderEnv(base_url=server_url))  # a factory's clients are MCP clients too
    assert spec.name == "openenv:AdderEnv" and "MCP tool" in spec.description


async def test_the_tiny_model_trains_two_steps_on_an_mcp_env(tiny_model_dir, tmp_path, server_url):
    # tool_choice "required" makes the tiny random model call a tool each turn, so the whole protocol runs
    spec = gw.envs.from_openenv(AdderEnv, base_url=server_url, max_turns=3, tool_choice="required")
    train, val, _ = spec.scenarios(0, max_tokens=128)  # room for a whole call: one cut short is no call
    model = gw.TrainableModel(name="adder", project="openenv-mcp", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    config = gw.LoopConfig(rollouts_per_group=3, groups_per_step=2, max_steps=2, eval_every=100, patience=10,
                           resample_no_signal=1)
    try:
        # seeded, so these two episodes are the same in every run (groupwise's server honours the seed)
        episodes = [await spec.rollout(model, s.model_copy(update={"sampling_seed": i})) for i, s in enumerate(val[:2])]
        summary = await gw.fit(model, spec.rollout, train, config=config)
    finally:
        await backend.close()
    for scenario, trajectory in zip(val, episodes):
        a, b = _question(scenario)
        messages = trajectory.messages()
        roles = [m["role"] for m in messages]
        assert roles[:4] == ["system", "user", "assistant", "tool"] and messages[2]["tool_calls"], messages
        assert trajectory.tools and [t["function"]["name"] for t in trajectory.tools] == ["add", "submit_answer"]
        submitted = None
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            answers = [m for m in messages[i + 1:i + 1 + len(message["tool_calls"])] if m["role"] == "tool"]
            assert answers  # every reply is a tool call, answered by a tool message
            for call, answer in zip(message["tool_calls"], answers):
                assert answer["tool_call_id"] == call["id"]
                arguments = json.loads(call["function"]["arguments"])
                if call["function"]["name"] == "add":  # the tool's real output
                    assert answer["content"] == str(arguments["a"] + arguments["b"])
                else:
                    submitted = arguments["answer"]
                    assert answer["content"] == f"submitted {submitted}"
        assert trajectory.reward == (0.0 if submitted is None else pytest.approx(closeness(submitted, a + b)))
        assert trajectory.metrics["done"] == float(submitted is not None)
        assert trajectory.metrics["truncated"] == float(submitted is None)
        choices = [c for c in trajectory.messages_and_choices if not isinstance(c, dict)]
        assert len(choices) == trajectory.metrics["turns"]
        for choice in choices:  # the token data GRPO trains on
            ids, logprobs = choice_token_ids(choice), choice_logprobs(choice)
            assert ids and len(logprobs) == len(ids) and all(lp <= 0.0 for lp in logprobs)
    assert summary.final_step == 2
    steps = rows(gw.load_history(summary.run_dir), "train")
    assert [r["step"] for r in steps] == [0, 1] and any(r["skipped"] == 0.0 for r in steps)
    assert all(any("tool_calls" in key for key in r) for r in steps)
