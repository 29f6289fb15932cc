"""The naming environment's server side: one request per episode, scored on the reply."""

from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from oneword import NAMING, naming_reward

from ..models import NamingAction, NamingObservation


class NamingEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._item = NAMING["train"][0]

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, split: str = "train",
              **kwargs: Any) -> NamingObservation:
        if split not in NAMING:
            raise ValueError(f"split={split!r}: one of {sorted(NAMING)}")
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        pool = NAMING[split]
        self._item = pool[(seed or 0) % len(pool)]
        return NamingObservation(request=self._item["request"], done=False, reward=0.0)

    def step(self, action: NamingAction, timeout_s: Optional[float] = None, **kwargs: Any) -> NamingObservation:  # type: ignore[override]
        self._state.step_count += 1
        return NamingObservation(request="", done=True, reward=naming_reward(action.message, self._item["category"]),
                                 metadata={"category": self._item["category"]})

    @property
    def state(self) -> State:
        return self._state
