"""`trajectory_group_batches` at ART's path (``art.batches``, also ``art.trajectory_group_batches``):
groups run ahead of training in batches, with ART's semantics. Up to
``batch_size * max_concurrent_batches`` groups are in flight; each finished group joins the current
batch, which is yielded as soon as it holds ``batch_size`` groups (so a batch is the first groups to
finish, not the first given); the last, shorter batch is yielded too. ``skip_batches`` drops the
first groups a resumed run already trained on. A failed group counts against
``max_batch_exceptions`` (per batch: the count restarts with each batch) and is left out of its batch;
one more propagates. No torch here (client side).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable

from groupwise.art.gather import GatherContext, set_gather_context, wrap_group_awaitable
from groupwise.core.trajectory import TrajectoryGroup

__all__ = ["trajectory_group_batches"]


async def trajectory_group_batches(
    groups: Iterable[Awaitable[TrajectoryGroup]],
    *,
    batch_size: int,
    max_batch_exceptions: int | float = 0,
    max_concurrent_batches: int = 4,
    skip_batches: int = 0,
    pbar_desc: str | None = "batches",
    pbar_total_completion_tokens: bool = True,
) -> AsyncIterator[list[TrajectoryGroup]]:
    """Yield lists of `batch_size` finished groups while later groups keep running."""
    from tqdm.auto import tqdm

    given = list(groups)
    for awaitable in given[:batch_size * skip_batches]:
        _discard(awaitable)
    unstarted = given[batch_size * skip_batches:]
    unstarted.reverse()  # popped from the end: the given order, without O(n) pops from the front
    pending: set[asyncio.Task] = set()
    batch: list[TrajectoryGroup] = []
    context = GatherContext(pbar_total_completion_tokens=pbar_total_completion_tokens,
                            max_exceptions=max_batch_exceptions, increment_pbar=False)
    try:
        with set_gather_context(context):
            while unstarted or pending:
                if context.pbar is None:
                    context.pbar = tqdm(desc=pbar_desc, total=batch_size, disable=pbar_desc is None)
                while len(pending) < batch_size * max_concurrent_batches and unstarted:
                    pending.add(asyncio.ensure_future(wrap_group_awaitable(unstarted.pop())))
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                context.pbar.update(len(done))
                batch.extend(g for task in done if (g := task.result()) is not None)
                if len(batch) >= batch_size:
                    context.pbar.close()
                    context.reset()
                    context.max_exceptions = max_batch_exceptions
                    yield batch[:batch_size]
                    batch = batch[batch_size:]
            if batch:
                yield batch
    finally:
        # a failure, or a caller that stops iterating: no group is left running unawaited
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for awaitable in unstarted:
            _discard(awaitable)


def _discard(awaitable: Awaitable) -> None:
    """Close a group that will never run, so that no coroutine is left un-awaited (a warning each)."""
    pending = awaitable.take_pending() if isinstance(awaitable, TrajectoryGroup) else [awaitable]
    for item in pending:
        if asyncio.iscoroutine(item):
            item.close()
