"""A tiny OpenEnv environment, laid out as `openenv init` lays one out (models, client, server), for the
OpenEnv tests: each episode asks for text dense in one vowel; a step's reward is that vowel's share of the
reply's letters; the episode is done after two replies."""

from .client import VowelEnv
from .models import VowelAction, VowelObservation

__all__ = ["VowelAction", "VowelEnv", "VowelObservation"]
