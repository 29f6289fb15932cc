"""The adder environment's server side: the tools are FastMCP tools; the reward is given by the step of a
`submit_answer` call (its StepResult's reward and done), as OpenEnv's MCP envs (e.g. finqa_env) give it."""

import random
from typing import Any, Optional
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.types import Action, Observation, State


def operands(seed: Optional[int]) -> tuple[int, int]:
    rng = random.Random(seed)
    return rng.randrange(100), rng.randrange(100)


def closeness(answer: Any, target: int) -> float:
    """The reward of a submitted answer: 1 when it is the sum, less the further it is."""
    try:
        return 1.0 / (1.0 + abs(int(answer) - target))
    except (TypeError, ValueError):
        return 0.0


class AdderEnvironment(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("adder")

        @mcp.tool
        def add(a: int, b: int) -> int:
            """Add two integers.

            Args:
                a: the first integer
                b: the second integer
            """
            return a + b

        @mcp.tool
        def submit_answer(answer: int) -> str:
            """Submit the final answer; this ends the episode.

            Args:
                answer: the sum
            """
            return f"submitted {answer}"

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._target = 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        a, b = operands(seed)
        self._target = a + b
        return Observation(done=False, reward=0.0, metadata={"question": f"What is {a} + {b}?"})

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": "use ListToolsAction or CallToolAction"})

    def _scored(self, action: Action, observation: Observation) -> Observation:
        if isinstance(action, CallToolAction) and action.tool_name == "submit_answer":
            observation.done = True
            observation.reward = closeness(action.arguments.get("answer"), self._target)
        return observation

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    @property
    def state(self) -> State:
        return self._state
