# Restated from johnson7788/RLDecisionAgent, backend/ART_mcp-rl/mcp_rl/rollout.py (corpus/README.md):
# an MCP agent over a stdio server whose tools become OpenAI tool schemas, called through an
# AsyncOpenAI client built from the model's inference_* fields; the Trajectory gets a `scenario`
# keyword, `tools`, `track_duration` and `finish()`. Every use of ART is kept call for call.
import json
from dataclasses import dataclass

import weave
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from openai import AsyncOpenAI

import art

weave.init("mcp-agent-training")


@dataclass
class McpScenario:
    task_description: str
    server_params: StdioServerParameters
    max_turns: int = 10


def get_content_text(result) -> str:
    return "".join(getattr(c, "text", "") for c in result.content)


@weave.op()
async def rollout(model: art.Model, scenario: McpScenario, debug: bool = False) -> art.Trajectory:
    traj = art.Trajectory(
        messages_and_choices=[], reward=0, metadata={"task": scenario.task_description},
        metrics={"task_completed": False, "success": False, "ran_out_of_turns": False}, scenario=scenario,
    )
    num_turns = 0
    task_completed = False
    try:
        async with stdio_client(scenario.server_params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools_result = await session.list_tools()
                tool_schemas = [{"type": "function", "function": {
                    "name": tool.name, "description": tool.description or f"MCP tool: {tool.name}",
                    "parameters": tool.inputSchema or {"type": "object", "properties": {}}}}
                    for tool in tools_result.tools]
                tool_schemas.append({"type": "function", "function": {
                    "name": "complete_task", "description": "Complete the task with a summary",
                    "parameters": {"type": "object", "properties": {"summary": {"type": "string"}},
                                   "required": ["summary"]}}})
                traj.tools = tool_schemas
                traj.messages_and_choices = [
                    {"role": "system", "content": f"You are an MCP agent with {scenario.max_turns} turns."},
                    {"role": "user", "content": f"Please complete this task: {scenario.task_description}"},
                ]
                while num_turns < scenario.max_turns and not task_completed:
                    num_turns += 1
                    async with traj.track_duration("llm_completion"):
                        client = AsyncOpenAI(api_key=model.inference_api_key, base_url=model.inference_base_url)
                        response = await client.chat.completions.create(
                            model=model.inference_model_name or model.name, messages=traj.messages(),
                            temperature=1.0, tools=tool_schemas, max_completion_tokens=64)
                    choice = response.choices[0]
                    traj.messages_and_choices.append(choice)
                    if not choice.message.tool_calls:
                        break
                    for tool_call in choice.message.tool_calls:
                        try:
                            tool_args = json.loads(tool_call.function.arguments)
                            if tool_call.function.name == "complete_task":
                                traj.metrics["task_completed"] = True
                                task_completed = True
                            else:
                                result = await session.call_tool(tool_call.function.name, tool_args)
                                traj.messages_and_choices.append(
                                    {"role": "tool", "tool_call_id": tool_call.id, "content": get_content_text(result)})
                        except Exception as e:
                            traj.messages_and_choices.append(
                                {"role": "tool", "tool_call_id": tool_call.id, "content": f"Error: {e}"})
    except Exception as e:
        print(f"[ERROR] MCP server error: {e}")
    if not task_completed and num_turns == scenario.max_turns:
        traj.metrics["ran_out_of_turns"] = True
    traj.metrics["num_turns"] = num_turns
    return traj.finish()
