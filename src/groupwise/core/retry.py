"""`retry`: retry a sync or async function with exponential backoff (ART's `art.retry`)."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from groupwise.errors import ConfigError

__all__ = ["retry"]

log = logging.getLogger(__name__)


def _log_retry(func: Callable, attempt: int, max_attempts: int, exc: BaseException, wait: float) -> None:
    log.warning("Retry %d/%d for %s after error: %s (next try in %.2fs)", attempt, max_attempts,
                getattr(func, "__name__", func), exc, wait)


def retry(
    max_attempts: int | Callable = 3,
    delay: float = 0.25,
    backoff_factor: float = 2.0,
    exceptions: type[BaseException] | tuple[type[BaseException], ...] = (Exception,),
    on_retry: Callable[[BaseException, int], Any] | None = None,
):
    """Retry a sync or async function on `exceptions`, sleeping delay, delay*factor, ... between tries.

        @retry(max_attempts=5, exceptions=(openai.APIConnectionError,))
        async def ask(...): ...

    `on_retry(exception, attempt)` (sync, or async for async functions) runs before each new try;
    `attempt` is the number of the try that failed (1-based). Without it each retry is logged as a
    warning, as ART's (``Retry 1/3 for ask after error: ...``): a retried failure is not silent. The
    last failure is re-raised as is.
    Also usable bare: ``@retry``.
    """
    if callable(max_attempts) and not isinstance(max_attempts, int):  # used as bare @retry
        return retry()(max_attempts)
    problems = []
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        problems.append(f"max_attempts={max_attempts!r} must be an int >= 1")
    if not isinstance(delay, (int, float)) or delay < 0:
        problems.append(f"delay={delay!r} must be a number >= 0 (seconds)")
    if not isinstance(backoff_factor, (int, float)) or backoff_factor < 0:
        problems.append(f"backoff_factor={backoff_factor!r} must be a number >= 0 (each wait is the last times it)")
    if problems:
        raise ConfigError(problems, what="retry arguments")
    if isinstance(exceptions, type):
        exceptions = (exceptions,)

    def decorate(func: Callable) -> Callable:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                wait = delay
                for attempt in range(1, max_attempts + 1):
                    try:
                        return await func(*args, **kwargs)
                    except exceptions as exc:
                        if attempt == max_attempts:
                            raise
                        if on_retry is not None:
                            out = on_retry(exc, attempt)
                            if inspect.isawaitable(out):
                                await out
                        else:
                            _log_retry(func, attempt, max_attempts, exc, wait)
                        await asyncio.sleep(wait)
                        wait *= backoff_factor

            return async_wrapper

        @functools.wraps(func)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            wait = delay
            for attempt in range(1, max_attempts + 1):
                try:
                    return func(*args, **kwargs)
                except exceptions as exc:
                    if attempt == max_attempts:
                        raise
                    if on_retry is not None:
                        on_retry(exc, attempt)
                    else:
                        _log_retry(func, attempt, max_attempts, exc, wait)
                    time.sleep(wait)
                    wait *= backoff_factor

        return sync_wrapper

    return decorate
