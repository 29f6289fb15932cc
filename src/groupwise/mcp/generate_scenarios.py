"""`generate_scenarios`: tasks for an agent on an MCP server, written by an LLM from the server's tools.

ART's signature and prompt contract: the generator sees the tools and resources as JSON and must answer
``{"scenarios": [{"task": str, "difficulty": 1..5}, ...]}`` with exactly `num_scenarios` items. The
answer is asked for with ``response_format`` json_schema, so a server with constrained decoding
(groupwise's, vLLM, OpenAI) can only produce that shape. Each task's length is capped in the schema: a
grammar without a cap lets a weak model write one string until the token limit cuts the JSON.

Any OpenAI-compatible endpoint works: ART's `generator_base_url` / `generator_api_key`, or `client=`
(for example a served model's `model.openai_client()`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from groupwise.errors import ConfigError, ScenarioGenerationError
from groupwise.mcp.types import GeneratedScenario, GeneratedScenarioCollection, MCPResource, MCPTool, preview_line

__all__ = ["MAX_TASK_CHARS", "generate_scenarios", "parse_scenarios", "preview_scenarios", "scenario_prompt",
           "scenario_schema"]

MAX_TASK_CHARS = 600  # a task is a paragraph at most: the schema's default cap (see the module docstring)
MAX_COMPLETION_TOKENS = 8000  # as ART asks: room for every scenario of a large request


def _tools_info(tools: Any) -> list[dict[str, Any]]:
    tools = getattr(tools, "tools", tools)  # `await session.list_tools()` as is
    return [(t if isinstance(t, MCPTool) else MCPTool.from_dict(t)).to_dict() for t in tools or []]


def _resources_info(resources: Any) -> list[dict[str, Any]]:
    resources = getattr(resources, "resources", resources)
    return [(r if isinstance(r, MCPResource) else MCPResource.from_dict(r)).to_dict() for r in resources or []]


def preview_scenarios(scenarios: Any, n: int = 5) -> None:
    """Print the first `n` tasks with their difficulty (ART's helper, which its MCP notebook calls on the
    scenarios as dicts): a list of dicts or `GeneratedScenario`s, or a collection."""
    for i, s in enumerate(list(getattr(scenarios, "scenarios", scenarios))[:max(n, 0)]):
        if isinstance(s, GeneratedScenario):
            task, difficulty = s.task, s.difficulty
        else:  # a dict, as ART takes them: its difficulty may be missing
            task, difficulty = str(s["task"]), s.get("difficulty", "N/A")
        print(preview_line(i + 1, task, difficulty))


def scenario_schema(num_scenarios: int, max_task_chars: int = MAX_TASK_CHARS) -> dict[str, Any]:
    """The JSON Schema of the generator's answer: exactly `num_scenarios` tasks with a difficulty."""
    return {
        "type": "object",
        "properties": {
            "scenarios": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "task": {"type": "string", "minLength": 1, "maxLength": max_task_chars},
                        "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
                    },
                    "required": ["task", "difficulty"],
                    "additionalProperties": False,
                },
                "minItems": num_scenarios,
                "maxItems": num_scenarios,
            }
        },
        "required": ["scenarios"],
        "additionalProperties": False,
    }


def scenario_prompt(tools_info: list[dict[str, Any]], resources_info: list[dict[str, Any]], num_scenarios: int,
                    custom_instructions: str | None = None, max_task_chars: int = MAX_TASK_CHARS) -> str:
    """The generator's instructions (the requirements ART's prompt sets, in our words)."""
    resources = json.dumps(resources_info, indent=2) if resources_info else "No resources available"
    prompt = (
        "You write realistic test scenarios for AI agents that use an MCP (Model Context Protocol) server.\n\n"
        f"The server's tools:\n{json.dumps(tools_info, indent=2)}\n\nIts resources:\n{resources}\n\n"
        f"Write {num_scenarios} different tasks a real user might want done with these tools. Each task must be "
        "doable with the tools; vary the complexity from one tool call to several; cover different uses and "
        "combinations of tools without naming which tools to use; and ask for a summary of the work done and "
        "an analysis of the results. Rate each task's difficulty from 1 (one tool call) to 5 (a complex "
        "multi-step analysis).\n\n"
        f'Answer with a JSON object whose "scenarios" array holds exactly {num_scenarios} objects, each with '
        f'"task" (a string of at most {max_task_chars} characters) and "difficulty" (an integer from 1 to 5).'
    )
    if custom_instructions:
        prompt += f"\n\nFollow these instructions closely when writing the scenarios:\n\n{custom_instructions}"
    return prompt


def parse_scenarios(content: str | None, num_scenarios: int) -> GeneratedScenarioCollection:
    """The generator's answer as a collection; a ScenarioGenerationError saying what was wrong otherwise."""
    if content is None:
        raise ScenarioGenerationError("the generator answered with no content (a refusal or only tool calls)")
    from groupwise.core.readers import JSONProblem, parse_json

    try:
        data = parse_json(content)
    except JSONProblem as exc:
        raise ScenarioGenerationError(
            f"the generator's answer is not JSON ({exc}); its first 500 characters: {content[:500]!r}. "
            "Use a model or server that supports response_format json_schema, or a stronger model"
        ) from None
    items = data.get("scenarios") if isinstance(data, dict) else data
    if isinstance(data, dict) and items is None:  # ART accepts the list under any single key
        items = next(iter(data.values()), None)
    if not isinstance(items, list):
        raise ScenarioGenerationError(f'expected {{"scenarios": [...]}}, got {content[:500]!r}')
    if len(items) != num_scenarios:
        raise ScenarioGenerationError(f"expected {num_scenarios} scenarios, the generator wrote {len(items)}")
    try:
        return GeneratedScenarioCollection.from_dicts(items)
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioGenerationError(f"a scenario is malformed ({exc!r}); the answer: {content[:500]!r}") from None


async def generate_scenarios(
    tools: Any,
    resources: Any = [],  # noqa: B006  (ART's default, kept equal; never mutated)
    num_scenarios: int = 24,
    show_preview: bool = True,
    custom_instructions: str | None = None,
    generator_model: str = "openai/gpt-4.1-mini",
    generator_api_key: str | None = None,
    generator_base_url: str = "https://openrouter.ai/api/v1",
    *,
    client: Any = None,
    max_task_chars: int = MAX_TASK_CHARS,
) -> GeneratedScenarioCollection:
    """Generate `num_scenarios` tasks for an agent using `tools` (MCPTools, dicts, `mcp.types.Tool`s, or a
    `ListToolsResult`) and `resources`, with `generator_model`.

    The endpoint is `client` (an `openai.AsyncOpenAI`) when given, else `generator_base_url` with
    `generator_api_key` (or the ``OPENROUTER_API_KEY`` environment variable), as ART's.
    `client` and `max_task_chars` (the schema's cap on a task's length) are groupwise's additions.
    """
    tools_info, resources_info = _tools_info(tools), _resources_info(resources)
    problems = []
    if not tools_info and not resources_info:
        problems.append("give at least one tool or resource: the scenarios are written for them")
    if not isinstance(num_scenarios, int) or num_scenarios < 1:
        problems.append(f"num_scenarios must be a positive integer, got {num_scenarios!r}")
    if not isinstance(max_task_chars, int) or max_task_chars < 1:
        problems.append(f"max_task_chars must be a positive integer, got {max_task_chars!r}")
    if client is None:
        generator_api_key = generator_api_key or os.getenv("OPENROUTER_API_KEY")
        if not generator_api_key:
            problems.append("pass generator_api_key, set OPENROUTER_API_KEY, or pass client=an openai.AsyncOpenAI")
    if problems:
        raise ConfigError(problems, what="generate_scenarios arguments")
    if client is None:
        import openai

        client = openai.AsyncOpenAI(api_key=generator_api_key, base_url=generator_base_url)
    response = await client.chat.completions.create(
        model=generator_model,
        messages=[{"role": "user", "content": scenario_prompt(tools_info, resources_info, num_scenarios,
                                                              custom_instructions, max_task_chars)}],
        max_completion_tokens=MAX_COMPLETION_TOKENS,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "scenario_list",
                                         "schema": scenario_schema(num_scenarios, max_task_chars)}},
    )
    collection = parse_scenarios(response.choices[0].message.content, num_scenarios)
    if show_preview:
        collection.print_difficulty_distribution()
        collection.preview(n=min(5, num_scenarios))
    return collection
