"""The naming environment's client (OpenEnv's typed EnvClient)."""

from typing import Dict

from openenv.core import EnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server.types import State

from .models import NamingAction, NamingObservation


class NamingEnv(EnvClient[NamingAction, NamingObservation, State]):
    def _step_payload(self, action: NamingAction) -> Dict:
        return {"message": action.message}

    def _parse_result(self, payload: Dict) -> StepResult[NamingObservation]:
        obs = payload.get("observation", {})
        observation = NamingObservation(request=obs.get("request", ""), done=payload.get("done", False),
                                        reward=payload.get("reward"), metadata=obs.get("metadata", {}))
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: Dict) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))
