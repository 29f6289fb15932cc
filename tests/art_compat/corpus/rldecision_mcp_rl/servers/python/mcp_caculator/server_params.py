# Restated from johnson7788/RLDecisionAgent, backend/ART_mcp-rl/servers/python/mcp_caculator/server_params.py
import os
import sys

from mcp import StdioServerParameters

server_params = StdioServerParameters(command=sys.executable, args=[os.path.join(os.path.dirname(__file__), "server.py")])
