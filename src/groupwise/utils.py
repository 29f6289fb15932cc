"""Helpers users of ART expect: `retry`, `iterate_dataset`, `split_dataset`.

All deterministic where it matters: a run resumed at step k (`iterate_dataset(..., initial_step=k)`)
sees exactly the batches the uninterrupted run saw from step k on, because each epoch's order is a
pure function of (seed, epoch), not of a random generator's history.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from groupwise.errors import ConfigError

__all__ = ["retry", "iterate_dataset", "DatasetBatch", "split_dataset", "epoch_order"]

T = TypeVar("T")
log = logging.getLogger(__name__)


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
    `attempt` is the number of the try that failed (1-based). The last failure is re-raised as is.
    Also usable bare: ``@retry``.
    """
    if callable(max_attempts) and not isinstance(max_attempts, int):  # used as bare @retry
        return retry()(max_attempts)
    problems = []
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        problems.append(f"max_attempts={max_attempts!r} must be an int >= 1")
    if not isinstance(delay, (int, float)) or delay < 0:
        problems.append(f"delay={delay!r} must be a number >= 0 (seconds)")
    if not isinstance(backoff_factor, (int, float)) or backoff_factor < 1:
        problems.append(f"backoff_factor={backoff_factor!r} must be >= 1")
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
                        log.debug("%s failed (try %d/%d): %r; retrying in %.2fs",
                                  func.__qualname__, attempt, max_attempts, exc, wait)
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
                    log.debug("%s failed (try %d/%d): %r; retrying in %.2fs",
                              func.__qualname__, attempt, max_attempts, exc, wait)
                    time.sleep(wait)
                    wait *= backoff_factor

        return sync_wrapper

    return decorate


@dataclass(frozen=True)
class DatasetBatch(Generic[T]):
    """One step's scenarios. `step` is global (across epochs); `epoch_step` restarts each epoch."""

    items: list[T]
    step: int
    epoch: int
    epoch_step: int


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The permutation of range(n) used in `epoch`: a pure function of (seed, epoch).

    A string seed makes `random.Random` hash it with SHA-512, so the order is the same in every
    process and Python version that keeps `random`'s algorithm (not affected by PYTHONHASHSEED).
    """
    order = list(range(n))
    random.Random(f"groupwise-epoch:{seed}:{epoch}").shuffle(order)
    return order


def iterate_dataset(
    items: Iterable[T],
    groups_per_step: int = 1,
    num_epochs: int = 1,
    initial_step: int = 0,
    seed: int = 0,
    use_tqdm: bool = True,
) -> Iterator[DatasetBatch[T]]:
    """Yield batches of `groups_per_step` items, shuffled per epoch, starting at global `initial_step`.

    Each epoch has ceil(len(items) / groups_per_step) steps (the last batch may be smaller); step s
    is epoch s // steps_per_epoch. Resuming with initial_step=k yields exactly the batches k, k+1, ...
    of a run started at 0 with the same arguments.
    """
    items = list(items)
    problems = []
    if not items:
        problems.append("items is empty; there is nothing to iterate over")
    for name, value, low in (("groups_per_step", groups_per_step, 1), ("num_epochs", num_epochs, 1),
                             ("initial_step", initial_step, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            problems.append(f"{name}={value!r} must be an int >= {low}")
    if problems:
        raise ConfigError(problems, what="iterate_dataset arguments")
    steps_per_epoch = math.ceil(len(items) / groups_per_step)
    total = steps_per_epoch * num_epochs
    bar = None
    if use_tqdm and initial_step < total:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=initial_step, desc="steps", unit="step", dynamic_ncols=True)
    try:
        for epoch in range(initial_step // steps_per_epoch, num_epochs):
            order = epoch_order(len(items), seed, epoch)
            for epoch_step in range(steps_per_epoch):
                step = epoch * steps_per_epoch + epoch_step
                if step < initial_step:
                    continue
                chunk = order[epoch_step * groups_per_step:(epoch_step + 1) * groups_per_step]
                yield DatasetBatch([items[i] for i in chunk], step, epoch, epoch_step)
                if bar is not None:
                    bar.update(1)
    finally:
        if bar is not None:
            bar.close()


def split_dataset(items: Iterable[T], fractions: Sequence[float] = (0.8, 0.1, 0.1),
                  seed: int = 0) -> tuple[list[T], ...]:
    """Shuffle `items` deterministically (by `seed`) and cut them into len(fractions) parts.

    Sizes are floor(fraction * n), and the items left over go one each to the parts with the
    largest remainders (ties: earlier part first), so the sizes always sum to n.
    Example: n=7, fractions (0.5, 0.3, 0.2) -> exact 3.5, 2.1, 1.4 -> floors 3, 2, 1 (6) -> the
    leftover item goes to the part with remainder 0.5 -> sizes 4, 2, 1.
    """
    items = list(items)
    fractions = list(fractions)
    problems = []
    if not fractions:
        problems.append("fractions is empty")
    bad = [f for f in fractions if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 <= f <= 1]
    if bad:
        problems.append(f"fractions {bad} must each be a number in [0, 1]")
    elif fractions and not math.isclose(math.fsum(fractions), 1.0, abs_tol=1e-9):
        problems.append(f"fractions {fractions} sum to {math.fsum(fractions)}; they must sum to 1")
    if problems:
        raise ConfigError(problems, what="split_dataset arguments")
    n = len(items)
    exact = [f * n for f in fractions]
    sizes = [math.floor(x + 1e-9) for x in exact]
    leftovers = n - sum(sizes)
    by_remainder = sorted(range(len(fractions)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in by_remainder[:leftovers]:
        sizes[i] += 1
    order = list(range(n))
    random.Random(f"groupwise-split:{seed}").shuffle(order)
    parts, start = [], 0
    for size in sizes:
        parts.append([items[i] for i in order[start:start + size]])
        start += size
    return tuple(parts)
