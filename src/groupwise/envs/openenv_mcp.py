"""OpenEnv's MCP tool environments as tool-calling conversations (`gw.envs.from_openenv` with an MCP client).

OpenEnv's newer environments are MCP tool environments: the server subclasses
``openenv.core.env_server.mcp_environment.MCPEnvironment`` (its tools are FastMCP tools) and the client is an
``openenv.core.mcp_client.MCPToolClient``. Their protocol, as OpenEnv's own agent loops drive them
(``examples/finqa_inference.py``): ``reset()`` gives the task (often in the observation's ``metadata``),
``list_tools()`` the tools, and each tool call is a ``step(CallToolAction(tool_name, arguments))`` whose
StepResult carries the tool's result (a ``CallToolObservation``) and the env's ``reward`` and ``done``: an
env scores the episode on the step of the call that ends it (e.g. ``submit_answer``). An episode here:

- the system prompt, then the reset observation as the first user message; the listed tools, as OpenAI
  function tools (their MCP ``inputSchema`` as the parameters), go with every request;
- each model reply is its `Choice` (what GRPO trains on); each of its tool calls is one env step, answered
  by a ``tool`` message holding the tool's output (its text content), or its error. A call whose arguments
  are not a JSON object is the model's fault: a tool message says so and the episode goes on (scored and
  trained on, as a tool env does), without a step;
- until the env says ``done``, or a reply calls no tool (the model's answer; with `answer_tool` that text is
  first submitted as that tool's one argument, so the env scores it), or `max_turns` replies (truncated).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from groupwise.core.trajectory import Choice, Trajectory
from groupwise.envs._chat import choice_text, complete, turn_sampling
from groupwise.errors import ArgumentTypeError, EnvError

DEFAULT_MCP_SYSTEM_PROMPT = "You are an agent acting in an environment through its tools. Call the tools to do the task."
_BASE_OBSERVATION_FIELDS = {"done", "reward", "metadata"}


def is_mcp_client(client_cls: Any) -> bool:
    """Whether `client_cls` is OpenEnv's MCP tool client (``MCPToolClient`` or a subclass, as env packages'
    clients are). False when openenv is not installed, or a version without MCP clients."""
    try:
        from openenv.core.mcp_client import MCPToolClient
    except ImportError:
        return False
    return isinstance(client_cls, type) and issubclass(client_cls, MCPToolClient)


def openai_tools(tools: list[Any]) -> list[dict[str, Any]]:
    """MCP tools (``openenv.core.env_server.mcp_types.Tool``: name, description, input_schema) as OpenAI
    function tools; the MCP input schema is a JSON schema, so it is the function's parameters as is."""
    converted = []
    for tool in tools:
        schema = dict(getattr(tool, "input_schema", None) or {}) or {"type": "object", "properties": {}}
        converted.append({"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                                           "parameters": schema}})
    return converted


def default_mcp_observation(observation: Any) -> str:
    """A reset (or non-tool) observation as the model reads it. MCP envs put the task in ``metadata``
    (``Observation(metadata={"question": ...})``): its own fields and its metadata together, one text value
    as itself, else as JSON."""
    if isinstance(observation, str):
        return observation
    dump = observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)
    shown = {k: v for k, v in dump.items() if k not in _BASE_OBSERVATION_FIELDS}
    shown.update(dump.get("metadata") or {})
    if len(shown) == 1 and isinstance(next(iter(shown.values())), str):
        return next(iter(shown.values()))
    return json.dumps(shown, default=str, ensure_ascii=False)


def tool_output(observation: Any, render: Callable[[Any], str]) -> tuple[str, bool]:
    """What a tool message says, and whether it is an error: a ``CallToolObservation``'s error, else its MCP
    result's text content (the tool's output as MCP gives it to a model), else its structured data as JSON.
    An env that answers a call with another observation (finqa's ``submit_answer`` step returns a plain one)
    is rendered by `render`."""
    if not hasattr(observation, "tool_name"):
        return render(observation), False
    error = getattr(observation, "error", None)
    if error is not None:
        kind = getattr(getattr(error, "error_type", None), "value", None)
        return (f"Error ({kind}): {error.message}" if kind else f"Error: {error.message}"), True
    result, failed = observation.result, False
    if isinstance(result, dict):
        failed = bool(result.get("is_error"))
        texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]
        if texts:
            return "\n".join(texts), failed
        result = result.get("data", result.get("structured_content"))
    return (result if isinstance(result, str) else json.dumps(result, default=str, ensure_ascii=False)), failed


def _arguments(raw: str | None) -> dict[str, Any] | str:
    """A tool call's arguments as a dict, or the reason they are not one (told to the model)."""
    try:
        parsed = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        return f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    return parsed if isinstance(parsed, dict) else f"the arguments are a JSON {type(parsed).__name__}, not an object"


def step_reward(value: Any) -> float:
    """A StepResult's reward as a number (an env may give None: nothing). Both OpenEnv modes use it."""
    return float(value) if isinstance(value, (int, float)) else 0.0


def episode_reward(rewards: list[float], reward: str) -> float:
    """The trajectory's reward from an episode's step rewards: their ``"sum"`` (the return) or the
    ``"last"`` one; 0 for an episode with no step. Both OpenEnv modes use it."""
    return (sum(rewards) if reward == "sum" else rewards[-1]) if rewards else 0.0


async def mcp_episode(env: Any, model: Any, scenario: Any, *, system_prompt: str, render: Callable[[Any], str],
                      max_turns: int, reward: str, tool_choice: str | dict[str, Any] | None,
                      answer_tool: str | None) -> Trajectory:
    """One episode of an MCP tool env on its connected client `env` (module doc). `scenario` is an
    `OpenEnvScenario`: its reset arguments and sampling settings."""
    from openenv.core.env_server.mcp_types import CallToolAction

    result = await env.reset(**scenario.reset)
    listed = await env.list_tools()
    if not listed:
        raise EnvError("the OpenEnv MCP env listed no tools (MCPToolClient.list_tools() returns [] when the "
                       "server's /mcp tools/list fails too); check the server's log and that its env subclasses "
                       "MCPEnvironment with FastMCP tools")
    tools = openai_tools(listed)
    names = {t["function"]["name"] for t in tools}
    if answer_tool is not None and answer_tool not in names:
        raise ArgumentTypeError(f"answer_tool={answer_tool!r} is not among the env's tools {sorted(names)}")
    trajectory = Trajectory(messages_and_choices=[{"role": "system", "content": system_prompt},
                                                  {"role": "user", "content": render(result.observation)}],
                            tools=tools)
    rewards: list[float] = []
    counts = {"tool_calls": 0.0, "tool_errors": 0.0, "answered": 0.0}
    done = bool(result.done)
    turn = 0

    async def call(name: str, arguments: dict[str, Any]) -> Any:
        nonlocal done
        step = await env.step(CallToolAction(tool_name=name, arguments=arguments))
        rewards.append(step_reward(step.reward))
        done = bool(step.done)
        counts["tool_calls"] += 1
        return step.observation

    while not done and turn < max_turns:
        choice: Choice = await complete(model, trajectory.messages(), turn_sampling(scenario, turn),
                                        tools=tools, tool_choice=tool_choice)
        trajectory.messages_and_choices.append(choice)
        turn += 1
        calls = choice.message.tool_calls or []
        if not calls:  # the model's answer ends the episode; the env scores it only through a tool
            if choice.finish_reason == "length":  # cut off at max_tokens (a call or an answer): truncated, unscored
                break
            counts["answered"] = 1.0
            if answer_tool is not None:
                await call(answer_tool, {_answer_argument(listed, answer_tool): choice_text(choice)})
            break
        for tool_call in calls:
            arguments = _arguments(tool_call.function.arguments)
            if isinstance(arguments, str):
                counts["tool_errors"] += 1
                content = f"Error: could not call {tool_call.function.name}: {arguments}."
            else:
                content, failed = tool_output(await call(tool_call.function.name, arguments), render)
                counts["tool_errors"] += float(failed)
            trajectory.messages_and_choices.append({"role": "tool", "tool_call_id": tool_call.id, "content": content})
            if done:
                break
    trajectory.reward = episode_reward(rewards, reward)
    trajectory.metrics.update(env_return=float(sum(rewards)), turns=float(turn), done=float(done),
                              truncated=float(not done and not counts["answered"]), **counts)
    return trajectory


def _answer_argument(tools: list[Any], name: str) -> str:
    """The one required argument of the answer tool, where a reply's text goes."""
    tool = next(t for t in tools if t.name == name)
    required = list((getattr(tool, "input_schema", None) or {}).get("required") or [])
    if len(required) != 1:
        raise ArgumentTypeError(f"answer_tool={name!r} must take exactly one required argument (the answer); "
                                f"its schema requires {required}")
    return required[0]


def check_mcp_arguments(*, action: Any, tool_choice: Any, answer_tool: Any, is_mcp: bool) -> None:
    """The MCP-only settings with a non-MCP client, and `action=` with an MCP one, are refused (each says why)."""
    if is_mcp and action is not None:
        raise ArgumentTypeError("an OpenEnv MCP tool client (MCPToolClient) plays tool calls, each a CallToolAction: "
                                "action= does not apply; leave it out")
    if not is_mcp and (tool_choice is not None or answer_tool is not None):
        raise ArgumentTypeError("tool_choice= and answer_tool= are for OpenEnv's MCP tool clients (MCPToolClient); "
                                "this client's episodes are text actions")


__all__ = ["DEFAULT_MCP_SYSTEM_PROMPT", "check_mcp_arguments", "default_mcp_observation", "episode_reward",
           "is_mcp_client", "mcp_episode", "step_reward",
           "openai_tools", "tool_output"]
