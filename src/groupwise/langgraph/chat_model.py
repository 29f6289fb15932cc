"""`wrap_rollout` and `init_chat_model`: ART's LangGraph integration.

`wrap_rollout(model, rollout)` returns a rollout that, while it runs, makes `init_chat_model()` return
a LangChain `ChatOpenAI` pointed at `model`'s OpenAI-compatible endpoint. Every chat completion that
chat model makes is recorded (recording.py says how and why at the HTTP layer), and when the rollout
returns its Trajectory the recorded calls become its messages and choices, with the sampled token ids
and logprobs training needs. The agent code stays plain LangGraph.

The rollout's context travels in a ContextVar: LangGraph runs nodes as asyncio tasks (and sync nodes
in worker threads) that copy the current context, so calls made anywhere inside the graph, `ainvoke`
or a sync node's `invoke`, are recorded into the rollout that started it, and concurrent rollouts
never mix.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from groupwise.errors import GroupwiseError, warn_ignored
from groupwise.langgraph.recording import RecordingTransport, fill_trajectory
from groupwise.core.recording import ChatCall, call_from_bodies
from groupwise.core.trajectory import Trajectory

__all__ = ["init_chat_model", "start_recording", "wrap_rollout"]


@dataclass
class _Rollout:
    model: Any
    loop: asyncio.AbstractEventLoop  # the rollout's loop: the model's client lives there
    calls: list[ChatCall] = field(default_factory=list)

    def record(self, request: dict[str, Any], response: dict[str, Any]) -> None:
        self.calls.append(call_from_bodies(request, response))


_CURRENT: contextvars.ContextVar[_Rollout] = contextvars.ContextVar("groupwise_langgraph_rollout")


def wrap_rollout(model: Any, fn: Callable[..., Awaitable[Trajectory]]) -> Callable[..., Awaitable[Trajectory]]:
    """`fn` (an async rollout returning a Trajectory) with its LangChain model calls recorded into the
    Trajectory it returns: the first conversation becomes `messages_and_choices` (and `tools`), any
    other (a sub-agent's) an entry of `additional_histories`. Call `init_chat_model()` inside `fn`."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Trajectory:
        rollout = _Rollout(model, asyncio.get_running_loop())
        token = _CURRENT.set(rollout)
        try:
            result = await fn(*args, **kwargs)
        finally:
            _CURRENT.reset(token)
        return fill_trajectory(result, rollout.calls)

    return wrapper


def start_recording(model: Any, loop: asyncio.AbstractEventLoop) -> _Rollout:
    """Record the calls of the chat models `init_chat_model()` builds from now on in this context (and
    the tasks it starts) for `model` (anything with `openai_client()` and `inference_name()`); the
    returned record's `calls` fill a trajectory (`fill_trajectory`). ART's `add_thread`, which programs
    call by hand (llm_wrapper.py); `wrap_rollout` scopes the same to one rollout."""
    rollout = _Rollout(model, loop)
    _CURRENT.set(rollout)
    return rollout


def init_chat_model(model: Any = None, *, model_provider: str | None = None, configurable_fields: Any = None,
                    config_prefix: str | None = None, **kwargs: Any) -> Any:
    """A LangChain `ChatOpenAI` for the model of the rollout being run by `wrap_rollout`.

    As ART's: `model`, `model_provider`, `configurable_fields` and `config_prefix` (LangChain's
    `init_chat_model` arguments) are ignored, because the endpoint and model name are the wrapped
    model's. Other keyword arguments are ChatOpenAI's and are passed on (`max_tokens`, `temperature`,
    defaulting to 1.0 as RL samples at the policy's own temperature). Logprobs are always asked for.
    """
    import httpx
    from langchain_openai import ChatOpenAI

    rollout = _CURRENT.get(None)
    if rollout is None:
        raise GroupwiseError(
            "init_chat_model() was called outside a rollout wrapped with wrap_rollout(model, rollout): it "
            "takes the endpoint and the trajectory to record into from that wrapper. Call it inside the "
            "rollout function, and run the rollout as `await wrap_rollout(model, rollout)(...)`"
        )
    ignored = [name for name, value in (("model_provider", model_provider), ("configurable_fields",
               configurable_fields), ("config_prefix", config_prefix)) if value is not None]
    if ignored:
        warn_ignored("groupwise.langgraph.init_chat_model", ignored, "the wrapped model's endpoint is used")
    for fixed in ("base_url", "api_key", "model_name", "http_client", "http_async_client", "streaming", "logprobs"):
        if fixed in kwargs:
            raise GroupwiseError(
                f"init_chat_model({fixed}=...) cannot be set: the chat model talks to the wrapped model's own "
                "endpoint, without streaming and with logprobs, so that its calls can be recorded and trained on"
            )
    client = rollout.model.openai_client()

    def record(request: dict[str, Any], response: dict[str, Any]) -> None:
        # the rollout running now (a model built in one rollout and reused in another records there)
        (_CURRENT.get(None) or rollout).record(request, response)

    # one transport for both of ChatOpenAI's clients: `invoke` (sync) is sent on the rollout's loop too
    transport = RecordingTransport(client, record, rollout.loop)

    kwargs.setdefault("temperature", 1.0)
    return ChatOpenAI(
        model=rollout.model.inference_name(),
        base_url=str(client.base_url),
        api_key=client.api_key or "groupwise",
        http_async_client=httpx.AsyncClient(transport=transport, timeout=None),
        http_client=httpx.Client(transport=transport, timeout=None),
        logprobs=True,
        disable_streaming=True,
        **kwargs,
    )
