"""An OpenEnv environment laid out as `openenv init` lays one out (models, client, server): each episode asks
the agent to name one member of a category in one word; the step's reward is `oneword.naming_reward`.
``reset(seed, split)``: the split's request number `seed` (train and validation hold different
categories). Served with ``uvicorn openenv_naming.server.app:app`` (bench/envs_learning.py starts it so)."""

from .client import NamingEnv
from .models import NamingAction, NamingObservation

__all__ = ["NamingAction", "NamingEnv", "NamingObservation"]
