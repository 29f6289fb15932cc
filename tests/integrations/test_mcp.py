"""groupwise.mcp, ART's `art.mcp`: an agent on a real MCP server (the `mcp` SDK's stdio transport, the
server a subprocess) is trained for two steps, and `generate_scenarios` writes scenarios for that
server with our own server as the generator."""

from __future__ import annotations

import json
import math
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

import groupwise as art  # noqa: E402
from groupwise.core.choices import choice_token_ids  # noqa: E402
from groupwise.local import LocalBackend  # noqa: E402
from groupwise.mcp import (GeneratedScenario, GeneratedScenarioCollection, MCPResource, MCPTool,  # noqa: E402
                           complete_task_tool, generate_scenarios)

SERVER = Path(__file__).with_name("weather_mcp_server.py")
FORECASTS = {"paris": "rain, 12C", "rome": "sun, 24C", "oslo": "snow, -3C"}  # what the server answers


@asynccontextmanager
async def weather_server():
    async with stdio_client(StdioServerParameters(command=sys.executable, args=[str(SERVER)])) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def rollout(model: art.Model, session: ClientSession, tools: list[MCPTool], city: str, seed: int):
    """ART's MCP rollout shape: the model calls the server's tools, then answers."""
    client = model.openai_client()
    messages = [{"role": "system", "content": "Use the tools, then answer in one line."},
                {"role": "user", "content": f"Will I need an umbrella in {city} tomorrow?"}]
    trajectory = art.Trajectory(messages_and_choices=list(messages), tools=[t.to_tool_schema() for t in tools])
    response = await client.chat.completions.create(
        model=model.inference_name(), messages=messages, tools=trajectory.tools, tool_choice="required",
        max_tokens=40, seed=seed)
    choice = response.choices[0]
    trajectory.messages_and_choices.append(choice)
    messages.append(art.choices.choice_to_message(choice))
    asked = []
    for call in choice.message.tool_calls or []:
        arguments = json.loads(call.function.arguments)
        asked.append(arguments.get("city"))
        result = await session.call_tool(call.function.name, arguments)  # the real server answers
        tool_message = {"role": "tool", "tool_call_id": call.id, "content": text_of(result)}
        trajectory.messages_and_choices.append(tool_message)
        messages.append(tool_message)
    response = await client.chat.completions.create(
        model=model.inference_name(), messages=messages, tools=trajectory.tools, max_tokens=8, seed=seed)
    trajectory.messages_and_choices.append(response.choices[0])
    answer = response.choices[0].message.content or ""
    trajectory.reward = float(asked == [city]) + (len(answer) % 7) / 7
    return trajectory


async def test_an_agent_on_a_real_mcp_server_is_trained(tiny_model_dir, tmp_path):
    model = art.TrainableModel(name="forecaster", project="mcp", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(tmp_path))
    await model.register(backend)
    async with weather_server() as session:
        tools = [MCPTool.from_dict(t) for t in (await session.list_tools()).tools]
        (resource,) = [MCPResource.from_dict(r) for r in (await session.list_resources()).resources]
        assert [t.name for t in tools] == ["get_forecast"]
        assert tools[0].parameters["properties"]["city"]["enum"] == ["paris", "rome", "oslo"]
        assert (resource.uri, resource.mime_type) == ("weather://cities", "text/plain")
        for step in range(2):
            groups = await art.gather_trajectory_groups(
                art.TrajectoryGroup(rollout(model, session, tools, city, seed=100 * step + i) for i in range(4))
                for city in ("paris", "oslo")
            )
            sampled = 0
            for t in (t for g in groups for t in g.trajectories):
                _, _, call, tool_result, answer = t.messages_and_choices
                (tool_call,) = call.message.tool_calls
                city = json.loads(tool_call.function.arguments)["city"]
                assert tool_result["content"] == FORECASTS[city]  # the server's answer to this call
                sampled += len(choice_token_ids(call)) + len(choice_token_ids(answer))
            result = await backend.train(model, groups, learning_rate=1e-3)
            m = result.metrics
            assert result.step == step + 1 and m["skipped"] == 0.0 and m["sequences"] == 8
            assert m["trainable_tokens"] + m["forced_tokens"] == sampled
            assert math.isclose(m["ratio_mean"], 1.0, abs_tol=2e-3)
    await backend.close()


async def test_generate_scenarios_with_our_server_as_the_generator(tiny_model_dir, tmp_path, capsys):
    # ART's call, pointed at the trained model's HTTP endpoint. Even a random model answers in the
    # schema: the server decodes under the response_format grammar.
    model = art.TrainableModel(name="writer", project="mcp", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(tmp_path))
    await model.register(backend)
    async with weather_server() as session:
        tools, resources = await session.list_tools(), await session.list_resources()  # the SDK's results, as is
    scenarios = await generate_scenarios(
        tools, resources, num_scenarios=2, show_preview=True, generator_model=model.inference_name(),
        generator_api_key=model.inference_api_key, generator_base_url=model.inference_base_url, max_task_chars=16)
    await backend.close()
    assert isinstance(scenarios, GeneratedScenarioCollection) and len(scenarios) == 2
    for s in scenarios:
        assert isinstance(s, GeneratedScenario) and 1 <= s.difficulty <= 5 and 1 <= len(s.task) <= 16
    assert "Difficulty distribution:" in capsys.readouterr().out
    assert GeneratedScenarioCollection.from_json(scenarios.to_json()).to_dicts() == scenarios.to_dicts()
