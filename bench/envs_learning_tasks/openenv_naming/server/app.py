"""The naming environment's server: ``uvicorn openenv_naming.server.app:app --port 8000``."""

from openenv.core.env_server.http_server import create_app

from ..models import NamingAction, NamingObservation
from .naming_environment import NamingEnvironment

# Every episode in flight holds a session: bench/envs_learning.py validates three runs at once on 32 requests
# each (96 sessions; a session refused over the limit fails its rollout), with room to spare.
app = create_app(NamingEnvironment, NamingAction, NamingObservation, env_name="naming", max_concurrent_envs=128)
