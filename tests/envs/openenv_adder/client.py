"""The adder environment's client: OpenEnv's MCP tool client, as its own MCP envs' clients are."""

from openenv.core.mcp_client import MCPToolClient


class AdderEnv(MCPToolClient):
    pass
