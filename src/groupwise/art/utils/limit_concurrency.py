"""`limit_concurrency`: at most n concurrent calls of an async function (per key), as ART's."""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable
from typing import Any

from groupwise.errors import ConfigError

__all__ = ["limit_concurrency"]


def limit_concurrency(n: int, derive_key: Callable[..., Any] | None = None):
    """Decorate an async function so at most `n` calls run at once.

        @limit_concurrency(4, derive_key=lambda model, scenario: model.name)
        async def rollout(model, scenario): ...

    `derive_key(*args, **kwargs)` splits the limit: each key gets its own `n`. Semaphores are kept per
    event loop, so the decorated function also works across several `asyncio.run` calls (tests,
    notebooks), where one semaphore bound to a closed loop would fail.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"n={n!r} must be an int >= 1", what="limit_concurrency arguments")
    per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Any, asyncio.Semaphore]] = (
        weakref.WeakKeyDictionary()
    )

    def decorate(func: Callable) -> Callable:
        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = derive_key(*args, **kwargs) if derive_key is not None else None
            semaphores = per_loop.setdefault(asyncio.get_running_loop(), {})
            semaphore = semaphores.get(key)
            if semaphore is None:
                semaphore = semaphores[key] = asyncio.Semaphore(n)
            async with semaphore:
                return await func(*args, **kwargs)

        return wrapper

    return decorate
