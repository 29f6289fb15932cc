"""A tiny OpenEnv MCP tool environment, written as OpenEnv's own MCP envs are (an `MCPEnvironment` with
FastMCP tools, served with `CallToolAction` / `CallToolObservation`, its client an `MCPToolClient`), for
the OpenEnv MCP tests: each episode asks for the sum of two numbers; the model may call `add(a, b)` and
ends the episode with `submit_answer(answer)`, rewarded by how close the answer is to the sum."""

from .client import AdderEnv

__all__ = ["AdderEnv"]
