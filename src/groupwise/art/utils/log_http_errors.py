"""`log_http_errors` at ART's path (``art.utils.log_http_errors``): a decorator for async calls over
httpx whose failed responses should say what the server answered."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx

from groupwise.errors import GroupwiseError

__all__ = ["log_http_errors"]

T = TypeVar("T")


def log_http_errors(func: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Re-raise an `httpx.HTTPStatusError` of `func` as an error naming the status, the URL and the
    server's ``detail`` (FastAPI's field) or ``error.message`` (OpenAI's), chained to the original. A
    body that is not JSON re-raises the original error unchanged."""

    @functools.wraps(func)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await func(*args, **kwargs)
        except httpx.HTTPStatusError as exc:
            try:
                body = exc.response.json()
            except ValueError:
                raise exc from None
            detail = body.get("detail") if isinstance(body, dict) else None
            if detail is None and isinstance(body, dict) and isinstance(body.get("error"), dict):
                detail = body["error"].get("message")
            raise HTTPError(f"[HTTP {exc.response.status_code}] {exc.request.url} {detail}") from exc

    return wrapper


class HTTPError(GroupwiseError):
    """A failed HTTP call, with what the server said (`log_http_errors`)."""
