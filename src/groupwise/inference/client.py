"""In-process OpenAI client: the real `openai.AsyncOpenAI` talking to the app through httpx's ASGI
transport (no port, no thread), so rollouts use exactly the code path of `groupwise serve`."""

from __future__ import annotations

from typing import Any

import httpx
import openai

__all__ = ["BASE_URL", "REQUEST_TIMEOUT_S", "in_process_client", "in_process_http_client"]

BASE_URL = "http://groupwise.local/v1"
# Seconds a request to an engine may take: a long completion queued behind a full batch on a CPU is
# minutes, and a request must not fail for waiting its turn.
REQUEST_TIMEOUT_S = 600.0


def in_process_http_client(app: Any, *, timeout: float = REQUEST_TIMEOUT_S) -> httpx.AsyncClient:
    # raise_app_exceptions=False: an unexpected server error reaches the caller as the app's 500
    # JSON error (as over HTTP), not as a raw exception from inside the app.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url=BASE_URL, timeout=timeout)


def in_process_client(app: Any, *, api_key: str = "groupwise-local", max_retries: int = 0,
                      timeout: float = REQUEST_TIMEOUT_S) -> openai.AsyncOpenAI:
    """An `openai.AsyncOpenAI` bound to `app` (a `create_app(...)` FastAPI app)."""
    return openai.AsyncOpenAI(base_url=BASE_URL, api_key=api_key, max_retries=max_retries,
                              http_client=in_process_http_client(app, timeout=timeout))
