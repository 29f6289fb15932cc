# Restated from johnson7788/RLDecisionAgent, backend/ART_mcp-rl/servers/python/mcp_caculator/server.py
# (corpus/README.md): a calculator MCP server over stdio.
from mcp.server.fastmcp import FastMCP

mcp = FastMCP("calculator")


@mcp.tool()
def add(a: float, b: float) -> float:
    """Add two numbers."""
    return a + b


@mcp.tool()
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


if __name__ == "__main__":
    mcp.run()
