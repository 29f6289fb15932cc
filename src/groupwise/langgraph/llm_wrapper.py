"""ART's `art.langgraph.llm_wrapper`: the pieces of `wrap_rollout`, which programs also call by hand.

``log_path = add_thread(thread_id, base_url, api_key, model_name)`` starts recording, for the current
task and the tasks it starts, every call of the chat models `init_chat_model()` builds afterwards (to
that endpoint, under that model name); ``create_messages_from_logs(log_path, trajectory)`` fills the
trajectory from them, as `wrap_rollout` does (chat_model.py). ART logged the LangChain messages to a
pickle file under ``.art/langgraph/``; here the calls are recorded at the HTTP layer with the sampled
token ids (recording.py), so nothing is written and `log_path` is the key of the thread's record.
`LoggingLLM` is ART's wrapper class of the chat model: here a pass-through to the model it wraps
(recording happens below it), for code that builds or checks for one.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from groupwise.errors import GroupwiseError
from groupwise.langgraph.chat_model import init_chat_model, start_recording, wrap_rollout
from groupwise.langgraph.recording import fill_trajectory
from groupwise.core.trajectory import Trajectory

__all__ = ["LoggingLLM", "add_thread", "create_messages_from_logs", "init_chat_model", "wrap_rollout"]

_threads: dict[str, Any] = {}  # log path -> the thread's record (chat_model's rollout)
_lock = threading.Lock()


class _Endpoint:
    """What `init_chat_model` needs of a model, from ART's (base_url, api_key, model name)."""

    def __init__(self, base_url: str, api_key: str | None, model: str) -> None:
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self._client: Any = None

    def openai_client(self) -> Any:
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key or "groupwise")
        return self._client

    def inference_name(self) -> str:
        return self.model


def add_thread(thread_id: str, base_url: str, api_key: str | None, model: str) -> str:
    """Start recording the calls of `init_chat_model()`'s chat models in this task (module doc);
    returns the key `create_messages_from_logs` reads them by (ART's log path)."""
    if not base_url:
        raise GroupwiseError("add_thread(..., base_url=None): pass the model's endpoint, model.inference_base_url "
                             "(set when the model is registered with a backend)")
    log_path = f".art/langgraph/{thread_id}"
    with _lock:
        _threads[log_path] = start_recording(_Endpoint(base_url, api_key, model), asyncio.get_running_loop())
    return log_path


def create_messages_from_logs(log_path: str, trajectory: Trajectory) -> Trajectory:
    """`trajectory` with the thread's recorded calls as its messages and choices (and tools; a second
    conversation, a sub-agent's, as an additional history), as `wrap_rollout` fills it."""
    with _lock:
        rollout = _threads.pop(log_path, None)
    if rollout is None:
        raise GroupwiseError(f"create_messages_from_logs({log_path!r}): no thread was started under this path in "
                             "this process (call add_thread first; each thread's calls are read once)")
    return fill_trajectory(trajectory, rollout.calls)


class LoggingLLM:
    """ART's logging wrapper of a LangChain chat model: here it passes every call to `llm` (groupwise
    records the calls at the HTTP layer, with their token ids); `logger` is not used."""

    def __init__(self, llm: Any, logger: Any = None, structured_output: Any = None, tools: Any = None) -> None:
        self.llm, self.logger, self.structured_output, self.tools = llm, logger, structured_output, tools

    def invoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:  # noqa: A002 - LangChain's name
        return self.llm.invoke(input, config, **kwargs)

    async def ainvoke(self, input: Any, config: Any = None, **kwargs: Any) -> Any:  # noqa: A002
        return await self.llm.ainvoke(input, config, **kwargs)

    def with_structured_output(self, tools: Any) -> "LoggingLLM":
        return LoggingLLM(self.llm.with_structured_output(tools), self.logger, tools, self.tools)

    def bind_tools(self, tools: Any, **kwargs: Any) -> "LoggingLLM":
        return LoggingLLM(self.llm.bind_tools(tools, **kwargs), self.logger, self.structured_output, tools)

    def with_retry(self, **kwargs: Any) -> "LoggingLLM":
        return LoggingLLM(self.llm.with_retry(**kwargs), self.logger, self.structured_output, self.tools)

    def with_config(self, config: Any = None, **kwargs: Any) -> "LoggingLLM":
        return LoggingLLM(self.llm.with_config(config, **kwargs), self.logger, self.structured_output, self.tools)

    def __getattr__(self, name: str) -> Any:  # anything else the wrapped chat model has
        return getattr(self.llm, name)
