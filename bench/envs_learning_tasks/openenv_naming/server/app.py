"""The naming environment's server: ``uvicorn openenv_naming.server.app:app --port 8000``."""

from openenv.core.env_server.http_server import create_app

from ..models import NamingAction, NamingObservation
from .naming_environment import NamingEnvironment

# three runs of 2 groups x 4 episodes at once (bench/envs_learning.py), with room to spare
app = create_app(NamingEnvironment, NamingAction, NamingObservation, env_name="naming", max_concurrent_envs=64)
