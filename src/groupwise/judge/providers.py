"""Where the judge runs. Every provider is reached through the `openai` SDK (the only client).

| judge_model            | endpoint                              | key                      |
|------------------------|---------------------------------------|--------------------------|
| ``openai/<model>``     | api.openai.com (or $OPENAI_BASE_URL)  | $OPENAI_API_KEY          |
| ``openrouter/<model>`` | openrouter.ai/api/v1                  | $OPENROUTER_API_KEY      |
| ``ollama/<model>``     | localhost:11434/v1 (or $OLLAMA_HOST)  | none                     |
| ``local/<model>``      | groupwise's own engine, in process    | none (no network at all) |
| any name + base_url=   | that OpenAI-compatible server         | api_key= or none         |

`local/` imports the engine (torch, transformers) lazily, on first use, so `import groupwise.judge`
stays light. The in-process engine is built once per model name and reused by later calls.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from groupwise.errors import ConfigError, JudgeError

OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"


@dataclass
class Endpoint:
    """A resolved judge: the client, the model name to send, and how to account for it."""

    client: Any  # openai.AsyncOpenAI
    model: str  # the name sent in the request
    label: str  # the name used for prices and cache keys, e.g. "openai/o4-mini"
    base_url: str
    local: bool = False
    paid: bool = False  # a provider that bills per token: an unknown price is flagged


def _key(var: str, judge_model: str, given: str | None) -> str:
    key = given or os.environ.get(var)
    if not key:
        raise JudgeError(
            f"judge {judge_model!r} needs an API key, but the environment variable {var} is not set. "
            f"Set {var} (export {var}=...), pass api_key=..., or use a local judge such as 'local/smollm2-135m'."
        )
    return key


def _client(base_url: str | None, api_key: str, timeout_s: float) -> Any:
    from openai import AsyncOpenAI

    # max_retries=0: the judge retries itself (bounded, with backoff, and it also retries bad answers).
    return AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=0)


def resolve(
    judge_model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    client: Any = None,
) -> Endpoint:
    """Turn a judge name (and optional endpoint) into an `Endpoint`; errors name what to fix."""
    if not isinstance(judge_model, str) or not judge_model.strip():
        raise ConfigError(f"judge_model={judge_model!r} must be a non-empty string like 'openai/o4-mini'", what="judge")
    if client is not None:  # an AsyncOpenAI the caller built (tests, custom auth, a model's own engine)
        from groupwise.inference.client import BASE_URL  # light: httpx + openai, no torch

        url = str(client.base_url).rstrip("/")
        # A client of groupwise's in-process engine (e.g. `model.openai_client()` judging with the policy's
        # base weights, `name@0`) is a small local judge: greedy, bounded explanations, like local/.
        return Endpoint(client=client, model=judge_model, label=judge_model, base_url=url,
                        local=url == BASE_URL.rstrip("/"))
    if base_url is not None:
        model = judge_model.split("/", 1)[1] if judge_model.startswith("openai/") else judge_model
        return Endpoint(
            client=_client(base_url, api_key or "EMPTY", timeout_s), model=model, label=judge_model, base_url=base_url
        )
    provider, sep, model = judge_model.partition("/")
    if not sep or not model:
        raise ConfigError(
            f"judge_model={judge_model!r} names no provider; use 'openai/<model>', 'openrouter/<vendor>/<model>', "
            "'ollama/<model>', 'local/<model>' (e.g. local/smollm2-135m), or pass base_url= for another "
            "OpenAI-compatible server",
            what="judge",
        )
    if provider == "openai":
        url = os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        key = _key("OPENAI_API_KEY", judge_model, api_key)
        return Endpoint(_client(url, key, timeout_s), model, judge_model, url, paid=True)
    if provider == "openrouter":
        key = _key("OPENROUTER_API_KEY", judge_model, api_key)
        return Endpoint(_client(OPENROUTER_BASE_URL, key, timeout_s), model, judge_model, OPENROUTER_BASE_URL, paid=True)
    if provider == "ollama":
        host = os.environ.get("OLLAMA_HOST", "http://localhost:11434").rstrip("/")
        if not host.startswith("http"):
            host = "http://" + host
        url = host + "/v1"
        return Endpoint(_client(url, api_key or "ollama", timeout_s), model, judge_model, url)
    if provider == "local":
        return Endpoint(client=local_client(model), model=model, label=judge_model, base_url="local", local=True)
    raise ConfigError(
        f"unknown judge provider {provider!r} in {judge_model!r}; known: openai, openrouter, ollama, local "
        "(or pass base_url= with the model name the server expects)",
        what="judge",
    )


_local_clients: dict[str, Any] = {}
_local_lock = threading.Lock()


def local_client(model: str) -> Any:
    """An AsyncOpenAI client bound in process to groupwise's engine serving base model `model`.

    Built once per model (loading weights is the slow part) and shared by later judge calls.
    """
    with _local_lock:
        if model not in _local_clients:
            _local_clients[model] = _build_local_client(model)
        return _local_clients[model]


def _build_local_client(model: str) -> Any:
    # The same code path as `groupwise serve`: engine -> registry -> FastAPI app -> AsyncOpenAI over
    # httpx's ASGI transport (no port). The base model is served under its own name.
    try:
        from groupwise.inference.client import in_process_client
        from groupwise.inference.engine import Engine
        from groupwise.inference.registry import ModelRegistry
        from groupwise.inference.server import create_app
        from groupwise.loading import load_base_model
    except ImportError as e:
        raise JudgeError(
            f"the local judge 'local/{model}' needs groupwise's inference engine, which could not be imported "
            f"({e}). Install the backend extra: pip install 'groupwise[backend]'"
        ) from e
    from groupwise.compute import compute_thread

    lm, tokenizer = compute_thread().call(load_base_model, model)  # groupwise/compute.py: one torch thread
    engine = Engine(lm, tokenizer)
    app = create_app(ModelRegistry(engine, base_name=model))
    return in_process_client(app)
