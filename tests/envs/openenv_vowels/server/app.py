"""The vowel environment's server: ``uvicorn openenv_vowels.server.app:app --port 8000``."""

from openenv.core.env_server.http_server import create_app

from ..models import VowelAction, VowelObservation
from .vowel_environment import VowelEnvironment

app = create_app(VowelEnvironment, VowelAction, VowelObservation, env_name="vowels", max_concurrent_envs=8)
