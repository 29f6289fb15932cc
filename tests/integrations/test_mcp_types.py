"""groupwise.mcp's types and the parsing of a generator's answer, as ART's behave (no server needed)."""

from __future__ import annotations

import dataclasses

import pytest

from groupwise.errors import ConfigError, ScenarioGenerationError
from groupwise.mcp import (GeneratedScenario, GeneratedScenarioCollection, MCPResource, MCPTool, complete_task_tool,
                           generate_scenarios)
from groupwise.mcp.generate_scenarios import parse_scenarios, scenario_schema

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_tools_and_resources_from_every_shape_they_come_in():
    ours = MCPTool("forecast", "weather", SCHEMA)  # positional, as ART's dataclass
    for shape in ({"name": "forecast", "description": "weather", "parameters": SCHEMA},
                  {"name": "forecast", "description": "weather", "inputSchema": SCHEMA},  # MCP's wire name
                  {"name": "forecast", "description": "weather", "input_schema": SCHEMA}):  # the SDK 2.x's dump
        assert MCPTool.from_dict(shape) == ours
    assert ours.to_tool_schema() == {"type": "function", "function": {"name": "forecast", "description": "weather",
                                                                      "parameters": SCHEMA}}
    assert dataclasses.asdict(ours) == ours.to_dict()
    r = MCPResource.from_dict({"uri": "w://c", "name": "c", "description": "d", "mimeType": "text/plain"})
    assert r == MCPResource("w://c", "c", "d", "text/plain") and r.to_dict()["mimeType"] == "text/plain"
    assert "mimeType" not in MCPResource("w://c", "c", "d").to_dict()
    assert complete_task_tool.to_tool_schema()["function"]["parameters"]["required"] == ["summary"]


def test_tools_from_the_mcp_sdk_objects():
    types = pytest.importorskip("mcp.types")
    tool = types.Tool(name="forecast", description="weather", inputSchema=SCHEMA)
    assert MCPTool.from_dict(tool) == MCPTool("forecast", "weather", SCHEMA)
    resource = types.Resource(uri="w://cities", name="cities", mimeType="text/plain")
    assert MCPResource.from_dict(resource) == MCPResource("w://cities", "cities", "", "text/plain")


def test_scenarios_validate_and_the_collection_helpers():
    with pytest.raises(ValueError, match="difficulty"):
        GeneratedScenario("t", 6)
    with pytest.raises(ValueError, match="difficulty"):
        GeneratedScenario("t", True)
    c = GeneratedScenarioCollection.from_dicts([{"task": f"task {i}", "difficulty": 1 + i % 5} for i in range(7)])
    train, val = c.split(5)
    assert (len(train), len(val), val[0].task) == (5, 2, "task 5")
    with pytest.raises(ValueError, match="train_size"):
        c.split(8)
    assert [s.difficulty for s in c.filter_by_difficulty(2, 3)] == [2, 3, 2]
    assert c.shuffle(seed=1).to_dicts() == c.shuffle(seed=1).to_dicts() != c.to_dicts()
    assert sorted(c.shuffle().to_dicts(), key=str) == sorted(c.to_dicts(), key=str)
    assert c.get_summary() == {"total_scenarios": 7, "difficulty_distribution": {1: 2, 2: 2, 3: 1, 4: 1, 5: 1},
                               "avg_difficulty": 18 / 7, "avg_task_length": 6.0}
    assert GeneratedScenarioCollection.from_json('[{"task": "a", "difficulty": 2}]').to_dicts() == [
        {"task": "a", "difficulty": 2}]
    assert len(GeneratedScenarioCollection.from_json(c.to_json())) == 7
    assert GeneratedScenario("x" * 130, 1).preview() == "x" * 120 + "…"


@pytest.mark.parametrize("content, message", [
    (None, "no content"),
    ("{'scenarios': []}", "not JSON"),
    ('{"scenarios": [{"task": "a", "difficulty": 2}]}', "expected 2 scenarios, the generator wrote 1"),
    ('{"scenarios": [{"task": "a", "difficulty": 2}, {"task": "b", "difficulty": 9}]}', "malformed"),
    ('{"scenarios": [{"task": "a", "difficulty": 2}, {"difficulty": 1}]}', "malformed"),
    ('"just text"', "expected"),
])
def test_a_bad_answer_says_what_was_wrong(content, message):
    with pytest.raises(ScenarioGenerationError, match=message):
        parse_scenarios(content, 2)
    assert issubclass(ScenarioGenerationError, ValueError)  # ART raises ValueError there


def test_a_good_answer_under_any_key():
    two = '[{"task": "a", "difficulty": 2}, {"task": "b", "difficulty": 5}]'
    for content in (f'{{"scenarios": {two}}}', f'{{"items": {two}}}', two):
        assert parse_scenarios(content, 2).to_dicts() == [{"task": "a", "difficulty": 2}, {"task": "b", "difficulty": 5}]
    schema = scenario_schema(3, max_task_chars=50)["properties"]["scenarios"]
    assert (schema["minItems"], schema["maxItems"], schema["items"]["properties"]["task"]["maxLength"]) == (3, 3, 50)


async def test_arguments_are_checked_before_any_call(monkeypatch):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        await generate_scenarios([], [], num_scenarios=0)
    assert len(info.value.problems) == 3  # no tools or resources, the count, the key
    assert issubclass(ConfigError, ValueError)  # ART raises ValueError there
