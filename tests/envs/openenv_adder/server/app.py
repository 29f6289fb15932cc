"""The adder environment's server: ``uvicorn openenv_adder.server.app:app --port 8000``."""

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation

from .adder_environment import AdderEnvironment

app = create_app(AdderEnvironment, CallToolAction, CallToolObservation, env_name="adder", max_concurrent_envs=8)
