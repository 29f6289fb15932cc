"""The tool an MCP agent calls to say it is done (as ART's): not served by any MCP server, the rollout
handles it, so the agent decides when the task is finished and says what it did."""

from groupwise.mcp.types import MCPTool

__all__ = ["complete_task_tool"]

complete_task_tool = MCPTool(
    name="complete_task",
    description="Complete a task",
    parameters={
        "type": "object",
        "properties": {"summary": {"type": "string", "description": "Summary of accomplishments"}},
        "required": ["summary"],
    },
)
