"""OpenEnv environments (Meta and Hugging Face's environments as HTTP services) as an `EnvSpec` for `gw.fit`.

``gw.envs.from_openenv(EchoEnv, base_url="http://localhost:8000")`` drives an OpenEnv server through its
own typed client (an ``openenv.core.EnvClient`` subclass: ``reset()`` / ``step(action)`` over the
server's WebSocket session). Each episode is one trajectory:

- the system prompt, then the reset observation as the first user message;
- each model reply (the `Choice` as the server returned it, what GRPO trains on) becomes the env's typed
  Action (`action`: by default the reply text in the Action's one required text field), and the step's
  observation the next user message (`observation`: by default its one text field, else its fields as JSON);
- until the env says ``done``, or `max_turns` replies (then the trajectory is marked truncated: an episode
  cut short, not one the env ended);
- its reward is the sum of the step rewards (the episode's return; ``reward="last"`` takes the final
  step's reward, for envs that score the whole episode at its end), with the step count, the return and
  done/truncated as metrics.

An MCP tool environment (its client an ``openenv.core.mcp_client.MCPToolClient``, as OpenEnv's newer envs
are) is played as a tool-calling conversation instead: its tools are the requests' OpenAI tools and each
tool call a ``CallToolAction`` step (`groupwise.envs.openenv_mcp`).

Every episode has its own session: a client class (or a factory) opens a new client per episode, so a
group's episodes run at once (the server's ``max_concurrent_envs`` must allow as many sessions); a client
instance has one session, so its episodes take turns on it. Scenarios are reset arguments: a seed each,
from disjoint train/validation/test ranges (`_chat.split_seeds`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import typing
from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field

from groupwise.core.trajectory import Trajectory
from groupwise.envs.spec import EnvSpec
from groupwise.envs._chat import Sampling, choice_text, complete, split_seeds, turn_sampling
from groupwise.envs.openenv_mcp import (DEFAULT_MCP_SYSTEM_PROMPT, check_mcp_arguments, default_mcp_observation,
                                        episode_reward, is_mcp_client, mcp_episode, step_reward)
from groupwise.errors import ArgumentTypeError, EnvError

DEFAULT_SYSTEM_PROMPT = "You are an agent acting in an environment. Each message is what you observe; reply with your action."
CONNECT_TIMEOUT_S = 60.0  # seconds an episode waits to open its session (OpenEnv's client: 10)
_BASE_OBSERVATION_FIELDS = {"done", "reward", "metadata"}


class OpenEnvScenario(Sampling):
    """One episode of an OpenEnv environment: the arguments of its ``reset``."""

    reset: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of env.reset (e.g. seed).")


def _type_args(client_cls: type) -> tuple[Any, ...]:
    """The (Action, Observation, State) a typed client declares: ``class EchoEnv(EnvClient[EchoAction, ...])``."""
    for klass in getattr(client_cls, "__mro__", ()):
        for base in getattr(klass, "__orig_bases__", ()):
            args = typing.get_args(base)
            if len(args) >= 2 and all(isinstance(a, type) for a in args[:2]):
                return args
    return ()


def _text_field(model_cls: type, *, required: bool) -> str | None:
    """The one text field of a pydantic Action/Observation class (beyond the base fields), else None."""
    fields = getattr(model_cls, "model_fields", None) or {}
    texts = [name for name, f in fields.items() if name not in _BASE_OBSERVATION_FIELDS and f.annotation is str
             and (f.is_required() or not required)]
    return texts[0] if len(texts) == 1 else None


def default_action(action_cls: type) -> Callable[[str], Any]:
    """The reply text as `action_cls` (its one required text field); an error says to pass `action=`."""
    field = _text_field(action_cls, required=True)
    if field is None:
        raise ArgumentTypeError(
            f"{action_cls.__name__} has no single required text field to put the model's reply in; pass "
            "action=lambda text: YourAction(...) to gw.envs.from_openenv (parse the reply into the Action)."
        )
    return lambda text: action_cls(**{field: text})


def default_observation(observation: Any) -> str:
    """An observation as the model reads it: its one text field, else its own fields as JSON."""
    if isinstance(observation, str):
        return observation
    dump = observation.model_dump() if hasattr(observation, "model_dump") else dict(observation)
    own = {k: v for k, v in dump.items() if k not in _BASE_OBSERVATION_FIELDS}
    if len(own) == 1 and isinstance(next(iter(own.values())), str):
        return next(iter(own.values()))
    return json.dumps(own, default=str, ensure_ascii=False)


def _async_client(client: Any) -> bool:
    """Whether `client` is OpenEnv's async client: its `reset` a coroutine function (openenv-core 0.3), or an
    `openenv.core.EnvClient` (openenv 0.10, whose `reset` returns an awaitable on a running event loop and a
    result elsewhere). Its `.sync()` wrapper is neither."""
    if inspect.iscoroutinefunction(client.reset):
        return True
    try:
        from openenv.core import EnvClient
    except ImportError:
        return False
    return isinstance(client, EnvClient)


def _session_opener(client: Any, base_url: str | None) -> tuple[Callable[[], Any], asyncio.Lock | None]:
    """How an episode gets its session: a fresh client per episode (a class with `base_url`, or a factory),
    or the one instance given, behind a lock (one WebSocket is one session on the server)."""
    if isinstance(client, type):
        if base_url is None:
            raise ArgumentTypeError(f"gw.envs.from_openenv({client.__name__}) needs base_url= (the server's "
                                    "http://host:port), or pass a factory: lambda: "
                                    f"{client.__name__}(base_url=...)")
        # The client's own connect timeout (10 s) is shorter than the stalls of a process that also serves and
        # trains the model on a loaded machine; its constructor takes a longer one.
        return (lambda: client(base_url=base_url, connect_timeout_s=CONNECT_TIMEOUT_S)), None
    if hasattr(client, "reset") and hasattr(client, "step"):
        if not _async_client(client):
            raise ArgumentTypeError("gw.envs.from_openenv takes OpenEnv's async EnvClient (not its .sync() "
                                    "wrapper): rollouts run on the event loop")
        return (lambda: client), asyncio.Lock()
    if callable(client):
        return client, None
    raise ArgumentTypeError(f"gw.envs.from_openenv takes an OpenEnv EnvClient class (with base_url=), a factory "
                            f"returning a client, or a client; got {type(client).__name__}")


async def _connect(env: Any) -> None:
    """Open `env`'s session, without the client's keepalive deadline. The session sits idle while the model
    writes each reply, in the process that serves and trains the model: on a loaded machine its event loop
    can answer a keepalive ping later than websockets' 20 s, and the client would then close a healthy
    session mid-episode (1011 keepalive ping timeout). Pings are still sent; a dead server still fails the
    next reset or step. OpenEnv's client exposes no setting for it, so it is set on its connection."""
    await env.connect()
    connection = getattr(env, "_ws", None)
    if connection is not None and hasattr(connection, "ping_timeout"):
        connection.ping_timeout = None


def from_openenv(
    client: Any,
    *,
    base_url: str | None = None,
    action: Callable[[str], Any] | None = None,
    observation: Callable[[Any], str] | None = None,
    system_prompt: str | None = None,
    max_turns: int = 8,
    reward: Literal["sum", "last"] = "sum",
    tool_choice: str | dict[str, Any] | None = None,
    answer_tool: str | None = None,
    max_tokens: int = 64,
    n_train: int = 256,
    n_val: int = 32,
    n_test: int = 32,
    name: str | None = None,
) -> Any:
    """An `EnvSpec` whose rollout plays one episode of an OpenEnv environment (module doc).

    Args:
        client: the env's typed client class (``EchoEnv``; with `base_url`), a factory returning a new client,
            or a client instance (its episodes then take turns on its one session).
        base_url: the server, ``http://localhost:8000`` (as its users start it: ``uvicorn server.app:app``).
        action: reply text -> the env's Action (default: the Action's one required text field); not for an MCP
            tool client, whose actions are the model's tool calls.
        observation: observation -> the user message the model reads (default: `default_observation`; for an
            MCP tool client `openenv_mcp.default_mcp_observation`, which shows the observation's metadata).
        system_prompt: the first message of every episode (default: `DEFAULT_SYSTEM_PROMPT`, or
            `openenv_mcp.DEFAULT_MCP_SYSTEM_PROMPT` for an MCP tool client).
        max_turns: the most model replies per episode; an episode cut there is marked truncated.
        reward: ``"sum"`` of the step rewards (the return), or the ``"last"`` step's.
        tool_choice: MCP tool clients only: the requests' ``tool_choice`` (``"required"`` makes every reply a
            tool call; None sends none, the server's default ``"auto"``).
        answer_tool: MCP tool clients only: the tool (of one required argument) that a reply without a tool
            call is submitted to, so the env scores the answer (e.g. ``"submit_answer"``); None ends the
            episode on such a reply without a step.
        max_tokens: the most tokens per reply (a scenario setting; ``scenarios(seed, max_tokens=...)`` too).
        n_train, n_val, n_test: how many reset seeds each split has.
    """
    if max_turns < 1:
        raise ArgumentTypeError(f"max_turns={max_turns} must be at least 1")
    if reward not in ("sum", "last"):
        raise ArgumentTypeError(f"reward={reward!r} must be 'sum' or 'last'")
    open_session, lock = _session_opener(client, base_url)
    # the client's class declares the Action type; a factory's clients are built without connecting, so one
    # built here shows it
    client_cls = client if isinstance(client, type) else type(client) if lock is not None else type(open_session())
    mcp = is_mcp_client(client_cls)
    check_mcp_arguments(action=action, tool_choice=tool_choice, answer_tool=answer_tool, is_mcp=mcp)
    if action is None and not mcp:
        declared = _type_args(client_cls) if client_cls is not None else ()
        if not declared:
            raise ArgumentTypeError("the client declares no Action type (EnvClient[Action, Observation, State]); "
                                    "pass action=lambda text: ... to build the env's action from a reply")
        action = default_action(declared[0])
    render = observation or (default_mcp_observation if mcp else default_observation)
    system_prompt = system_prompt if system_prompt is not None else (DEFAULT_MCP_SYSTEM_PROMPT if mcp
                                                                      else DEFAULT_SYSTEM_PROMPT)

    async def episode(env: Any, model: Any, scenario: OpenEnvScenario) -> Trajectory:
        if mcp:
            return await mcp_episode(env, model, scenario, system_prompt=system_prompt, render=render,
                                     max_turns=max_turns, reward=reward, tool_choice=tool_choice,
                                     answer_tool=answer_tool)
        result = await env.reset(**scenario.reset)
        trajectory = Trajectory(messages_and_choices=[{"role": "system", "content": system_prompt},
                                                      {"role": "user", "content": render(result.observation)}])
        rewards: list[float] = []
        done = bool(result.done)
        turn = 0
        while not done and turn < max_turns:
            choice = await complete(model, trajectory.messages(), turn_sampling(scenario, turn))
            trajectory.messages_and_choices.append(choice)
            turn += 1
            result = await env.step(action(choice_text(choice)))
            rewards.append(step_reward(result.reward))
            done = bool(result.done)
            if not done and turn < max_turns:
                trajectory.messages_and_choices.append({"role": "user", "content": render(result.observation)})
        trajectory.reward = episode_reward(rewards, reward)
        trajectory.metrics.update(env_return=float(sum(rewards)), turns=float(turn), done=float(done),
                                  truncated=float(not done))
        return trajectory

    async def rollout(model: Any, scenario: OpenEnvScenario) -> Trajectory:
        if not isinstance(scenario, OpenEnvScenario):
            raise ArgumentTypeError(f"an OpenEnv rollout takes an OpenEnvScenario (from spec.scenarios), got "
                                    f"{type(scenario).__name__}")
        if lock is not None:
            async with lock:
                env = open_session()
                await _connect(env)
                return await episode(env, model, scenario)
        env = open_session()
        try:
            await _connect(env)
        except Exception as exc:
            raise EnvError(f"could not open a session on the OpenEnv server ({exc}); is it running, and does its "
                           "create_app(..., max_concurrent_envs=N) allow a group's episodes at once?") from exc
        try:
            return await episode(env, model, scenario)
        finally:
            await env.close()

    def scenarios(seed: int, **overrides: Any) -> tuple[list[Any], list[Any], list[Any]]:
        settings = {"max_tokens": max_tokens, **overrides}
        train, val, test = split_seeds(seed, n_train, n_val, n_test)
        return tuple([OpenEnvScenario(reset={"seed": s}, **settings) for s in seeds] for seeds in (train, val, test))

    label = name or f"openenv:{client_cls.__name__ if client_cls is not None else 'env'}"
    return EnvSpec(
        name=label,
        description=f"OpenEnv {'MCP tool ' if mcp else ''}environment {label}, {reward} of its step rewards per episode",
        rollout=rollout,
        scenarios=scenarios,
        validate=lambda trajectory: trajectory.reward,
        val_metric="episode_return",  # the validation episodes' mean reward ("reward" names a history field)
        reward="verifiable",
    )


__all__ = ["DEFAULT_SYSTEM_PROMPT", "OpenEnvScenario", "default_action", "default_observation", "from_openenv"]
