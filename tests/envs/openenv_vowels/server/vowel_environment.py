"""The vowel environment's server side."""

import random
from typing import Any, Optional
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from ..models import VowelAction, VowelObservation, vowel_share

STEPS = 2


class VowelEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._vowel = "a"

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> VowelObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._vowel = random.Random(seed).choice("aeiou")
        return VowelObservation(instruction=f"Write text with as many letters '{self._vowel}' as you can.",
                                done=False, reward=0.0)

    def step(self, action: VowelAction, timeout_s: Optional[float] = None, **kwargs: Any) -> VowelObservation:  # type: ignore[override]
        self._state.step_count += 1
        return VowelObservation(
            instruction=f"Again: more letters '{self._vowel}'.",
            vowel_count=action.message.lower().count(self._vowel),
            done=self._state.step_count >= STEPS,
            reward=vowel_share(action.message, self._vowel),
            metadata={"vowel": self._vowel},
        )

    @property
    def state(self) -> State:
        return self._state
