"""A tiny MCP server over stdio, started by test_mcp.py as a real subprocess: one tool, one resource."""

from typing import Literal

try:  # mcp 2.x renamed FastMCP to MCPServer
    from mcp.server.mcpserver import MCPServer
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer

FORECASTS = {"paris": "rain, 12C", "rome": "sun, 24C", "oslo": "snow, -3C"}

server = MCPServer("weather")


@server.tool()
def get_forecast(city: Literal["paris", "rome", "oslo"]) -> str:
    """Tomorrow's weather in a city."""
    return FORECASTS[city]


@server.resource("weather://cities", description="The cities with a forecast", mime_type="text/plain")
def cities() -> str:
    return ", ".join(FORECASTS)


if __name__ == "__main__":
    server.run("stdio")
