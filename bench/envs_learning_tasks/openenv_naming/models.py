"""Data models of the naming environment."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class NamingAction(Action):
    """Action: the agent's reply."""

    message: str = Field(..., description="The reply")


class NamingObservation(Observation):
    """Observation: the request to answer."""

    request: str = Field(default="", description="What to name, e.g. 'Name a fruit.'")
