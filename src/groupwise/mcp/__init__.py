"""ART's `art.mcp`: MCP tools and resources as types, the `complete_task` tool, and `generate_scenarios`.

Nothing here needs the `mcp` SDK: an agent reaches its server with the SDK (the `mcp` extra) and turns
what `session.list_tools()` returns into `MCPTool`s (`MCPTool.from_dict` takes the SDK's objects), whose
`to_tool_schema()` goes in a chat completion's ``tools``.
"""

from groupwise.mcp.default_tools import complete_task_tool
from groupwise.mcp.generate_scenarios import generate_scenarios
from groupwise.mcp.types import GeneratedScenario, GeneratedScenarioCollection, MCPResource, MCPTool

__all__ = [
    "GeneratedScenario",
    "GeneratedScenarioCollection",
    "MCPResource",
    "MCPTool",
    "complete_task_tool",
    "generate_scenarios",
]
