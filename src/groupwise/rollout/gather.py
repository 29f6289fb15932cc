"""Gathering: run every rollout of every group concurrently, under one exception budget.

    groups = await gather_trajectory_groups(
        (TrajectoryGroup(rollout(model, s) for _ in range(18)) for s in batch),
        pbar_desc="train", max_exceptions=0.05, after_each=judge)

How it works, and why:

- Every pending rollout (`group.take_pending()`) becomes one asyncio task at once, so an inference
  engine sees all of them in flight and batches their forward passes. `max_concurrency`
  caps that with a semaphore when an endpoint cannot take them all.
- Results are collected by task done-callbacks, not by `asyncio.wait(FIRST_COMPLETED)` in a loop:
  `wait` walks every pending task on each call, which is quadratic in the number of rollouts. With
  callbacks the cost per rollout is constant (`bench/gather.py` measures it).
- Trajectories keep the order in which their rollouts were given, not the order they finished in,
  so a run is reproducible.
- The exception budget (`max_exceptions`) is a count, or a fraction in (0, 1) of the rollouts this
  call runs. Within budget, an exception is recorded on its group (`PydanticException`: type,
  message, traceback) and counted; one more and every unfinished rollout is cancelled and
  `GatherError` says how many failed of how many, with the first traceback.
- A group may also be given as an awaitable that returns a `TrajectoryGroup` (ART's declared type,
  e.g. a coroutine that builds and awaits its own group). It runs as one task; if it raises, the
  exception counts against the budget like a rollout's and is recorded on an empty group in its place.
- `after_each(group)` runs as soon as that group's rollouts are done (while others still run), so a
  judge scores early groups while late ones play. It may return the group, a replacement, None (drop)
  or a list of groups. Its own errors are not budgeted: they cancel the rest and propagate.
- Cancellation (Ctrl-C under `asyncio.run`, or the caller cancelling) cancels every pending rollout
  and waits for them to finish cancelling before it propagates, so no task is left pending and no
  coroutine is left un-awaited.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Union

from groupwise.compat import warn_ignored
from groupwise.errors import ConfigError, GatherError
from groupwise.types import PydanticException, Trajectory, TrajectoryGroup

__all__ = ["gather_trajectory_groups", "gather_trajectories", "exception_budget", "trajectory_group"]

log = logging.getLogger(__name__)

AfterEach = Callable[[TrajectoryGroup], Union[TrajectoryGroup, None, list, Awaitable[Any]]]

# The progress bar's postfix (mean reward, exceptions) is re-rendered at most this often: formatting it
# on every rollout would cost more than the rollout bookkeeping itself.
_POSTFIX_INTERVAL_S = 0.2


def exception_budget(max_exceptions: int | float, n_rollouts: int) -> int:
    """How many rollouts may raise: a count as is, a fraction x in (0, 1) as floor(x * n_rollouts).

    floor, so that 0.05 of 18 rollouts allows 0 (not 1): the budget never exceeds the fraction asked.
    """
    if isinstance(max_exceptions, float) and 0 < max_exceptions < 1:
        return math.floor(max_exceptions * n_rollouts)
    return int(max_exceptions)


def _check_args(max_exceptions: Any, max_concurrency: Any, after_each: Any) -> None:
    problems: list[str] = []
    if isinstance(max_exceptions, bool) or not isinstance(max_exceptions, (int, float)):
        problems.append(f"max_exceptions={max_exceptions!r} must be an int count or a float fraction in (0, 1)")
    elif not math.isfinite(max_exceptions) or max_exceptions < 0:
        problems.append(f"max_exceptions={max_exceptions!r} must be >= 0 (a count) or in (0, 1) (a fraction)")
    elif isinstance(max_exceptions, float) and max_exceptions >= 1 and not max_exceptions.is_integer():
        problems.append(
            f"max_exceptions={max_exceptions!r} is neither a fraction in (0, 1) nor a whole count; "
            "pass an int such as 3, or a fraction such as 0.1"
        )
    if max_concurrency is not None and (
        isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1
    ):
        problems.append(f"max_concurrency={max_concurrency!r} must be None (no cap) or an int >= 1")
    if after_each is not None and not callable(after_each):
        problems.append(f"after_each={after_each!r} must be None or a callable taking a TrajectoryGroup")
    if problems:
        raise ConfigError(problems, what="gather arguments")


class _Progress:
    """A tqdm bar with done/total, running mean reward, exception count and the running means of the
    trajectories' metrics (the first `max_metrics` of them; None shows all); a no-op when disabled."""

    def __init__(self, desc: str | None, total: int, max_metrics: int | None = None) -> None:
        self.bar = None
        self.reward_sum = 0.0
        self.n_rewards = 0
        self.n_exceptions = 0
        self.max_metrics = max_metrics
        self.metric_sums: dict[str, float] = {}
        self.metric_counts: dict[str, int] = {}
        self._next_postfix = 0.0
        if desc is not None and total > 0:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="rollout", dynamic_ncols=True, leave=True)

    def done(self, result: "Trajectory | TrajectoryGroup | None") -> None:
        trajectories = [] if result is None else [result] if isinstance(result, Trajectory) else result.trajectories
        if result is None:
            self.n_exceptions += 1
        for t in trajectories:
            self.reward_sum += t.reward
            self.n_rewards += 1
            if self.bar is not None:
                for name, value in t.metrics.items():
                    self.metric_sums[name] = self.metric_sums.get(name, 0.0) + float(value)
                    self.metric_counts[name] = self.metric_counts.get(name, 0) + 1
        if self.bar is None:
            return
        self.bar.update(1)
        now = time.monotonic()
        if now >= self._next_postfix:
            self._next_postfix = now + _POSTFIX_INTERVAL_S
            self._set_postfix()

    def _set_postfix(self) -> None:
        mean = self.reward_sum / self.n_rewards if self.n_rewards else float("nan")
        postfix = {"reward": f"{mean:.3f}", "exceptions": self.n_exceptions}
        names = list(self.metric_sums)[: self.max_metrics] if self.max_metrics is not None else self.metric_sums
        for name in names:
            postfix[name] = f"{self.metric_sums[name] / self.metric_counts[name]:.3g}"
        self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self._set_postfix()
            self.bar.close()


class _Gathering:
    """The state of one gather call: the groups, their result slots, the counters, the tasks."""

    def __init__(self, groups: list[TrajectoryGroup | Awaitable[TrajectoryGroup]], max_exceptions: int | float,
                 pbar_desc: str | None, max_concurrency: int | None, max_metrics: int | None = None) -> None:
        # A group given as an awaitable runs as one task in an empty placeholder group, which its
        # result replaces (or which records its exception).
        self.producers = {g for g, item in enumerate(groups) if not isinstance(item, TrajectoryGroup)}
        self.groups: list[TrajectoryGroup] = [TrajectoryGroup() if g in self.producers else item
                                              for g, item in enumerate(groups)]
        self.pending = [[groups[g]] if g in self.producers else group.take_pending()
                        for g, group in enumerate(self.groups)]
        self.total = sum(len(p) for p in self.pending)
        self.budget = exception_budget(max_exceptions, self.total)
        self.max_exceptions = max_exceptions
        # slots[g][i]: the i-th rollout's Trajectory, or None while running / when it raised.
        self.slots: list[list[Trajectory | None]] = [[None] * len(p) for p in self.pending]
        self.remaining = [len(p) for p in self.pending]
        self.n_failed = 0
        self.first_failure: BaseException | None = None
        self.over_budget = False
        self.progress = _Progress(pbar_desc, self.total, max_metrics)
        self.semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.tasks: list[asyncio.Task] = []
        # Groups whose rollouts are all done, in completion order; `wake` is set when one is added.
        self.ready: list[int] = []
        self.wake = asyncio.Event()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for g, awaitables in enumerate(self.pending):
            if not awaitables:
                self.ready.append(g)
                continue
            for i, awaitable in enumerate(awaitables):
                if self.semaphore is not None:
                    task = loop.create_task(self._limited(awaitable))
                elif inspect.iscoroutine(awaitable):
                    task = loop.create_task(awaitable)
                else:  # a Future or an object with __await__
                    task = loop.create_task(_as_coroutine(awaitable))
                task.add_done_callback(self._callback(g, i))
                self.tasks.append(task)
        if self.ready:
            self.wake.set()

    async def _limited(self, awaitable: Awaitable[Trajectory]) -> Trajectory:
        started = False
        try:
            async with self.semaphore:  # type: ignore[union-attr]
                started = True
                return await awaitable
        finally:
            if not started and inspect.iscoroutine(awaitable):
                awaitable.close()  # cancelled while queued: the rollout never ran, close it quietly

    def _callback(self, g: int, i: int) -> Callable[[asyncio.Task], None]:
        def on_done(task: asyncio.Task) -> None:
            exc: BaseException | None
            if task.cancelled():
                exc = asyncio.CancelledError("the rollout was cancelled (not by gather)")
            else:
                exc = task.exception()  # also marks it retrieved: no "never retrieved" warning
            if self.over_budget:
                return  # being torn down; the error is already decided
            if exc is None:
                result = task.result()
                if g in self.producers:
                    if isinstance(result, TrajectoryGroup) and not result.pending:
                        self.groups[g] = result
                        self.progress.done(result)
                    else:
                        exc = TypeError(
                            f"groups[{g}] is an awaitable that returned {type(result).__name__}"
                            f"{' with rollouts never run' if isinstance(result, TrajectoryGroup) else ''}; "
                            "an awaitable group must return a finished TrajectoryGroup"
                        )
                elif isinstance(result, Trajectory):
                    self.slots[g][i] = result
                    self.progress.done(result)
                else:
                    exc = TypeError(
                        f"a rollout of group {g} returned {type(result).__name__}, not a Trajectory; "
                        "a rollout must `return` the Trajectory it built"
                    )
            if exc is not None:
                self.n_failed += 1
                self.progress.done(None)
                if self.first_failure is None:
                    self.first_failure = exc
                if self.n_failed > self.budget:
                    self.over_budget = True
                    self.wake.set()
                    return
                self.groups[g].exceptions.append(PydanticException.from_exception(exc))
            self.remaining[g] -= 1
            if self.remaining[g] == 0:
                group = self.groups[g]
                group.trajectories.extend(t for t in self.slots[g] if t is not None)
                self.slots[g] = []
                self.ready.append(g)
                self.wake.set()

        return on_done

    def budget_error(self) -> GatherError:
        exc = self.first_failure
        assert exc is not None
        first = PydanticException.from_exception(exc)
        if isinstance(self.max_exceptions, float) and 0 < self.max_exceptions < 1:
            allowed = f"max_exceptions={self.max_exceptions} of {self.total} rollouts allows {self.budget}"
        else:
            allowed = f"max_exceptions={self.budget} allows {self.budget}"
        message = (
            f"{self.n_failed} of {self.total} rollouts raised an exception; {allowed}. "
            f"The unfinished rollouts were cancelled. Fix the rollout, or raise max_exceptions "
            f"to record failures on their groups instead.\nFirst exception:\n{first.traceback}"
        )
        recorded = [e for g in self.groups for e in g.exceptions] + [first]
        err = GatherError(message, exceptions=recorded)
        err.__cause__ = exc
        return err

    async def cancel_all(self, extra: Iterable[asyncio.Task] = ()) -> None:
        """Cancel every unfinished task and wait until each has finished cancelling."""
        tasks = [t for t in (*self.tasks, *extra) if not t.done()]
        for t in tasks:
            t.cancel()
        if tasks:
            # shield-free wait; a second Ctrl-C while waiting propagates, which is what the user asked.
            await asyncio.wait(tasks)


async def _as_coroutine(awaitable: Awaitable[Trajectory]) -> Trajectory:
    return await awaitable


async def _call_after_each(after_each: AfterEach, group: TrajectoryGroup, g: int) -> list[TrajectoryGroup]:
    try:
        out = after_each(group)
        if inspect.isawaitable(out):
            out = await out
    except Exception as exc:
        exc.add_note(f"(raised by after_each on group {g})")
        raise
    if out is None:
        return []
    items = out if isinstance(out, (list, tuple)) else [out]
    for item in items:
        if not isinstance(item, TrajectoryGroup):
            raise TypeError(
                f"after_each returned {type(item).__name__} for group {g}; it must return a "
                "TrajectoryGroup, None (drop the group) or a list of TrajectoryGroups"
            )
    return list(items)


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup | Awaitable[TrajectoryGroup]],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    after_each: AfterEach | None = None,
    max_concurrency: int | None = None,
    max_metrics: int | None = None,
    pbar_total_completion_tokens: bool = False,
) -> list[TrajectoryGroup]:
    """Run every pending rollout of every group concurrently and return the finished groups.

    Args:
        groups: `TrajectoryGroup`s built from rollout awaitables, or already finished, or awaitables
            (coroutines) that return a finished `TrajectoryGroup`.
        pbar_desc: the progress bar's label; None disables the bar.
        max_exceptions: how many rollouts may raise: an int count, or a float fraction in (0, 1) of
            the rollouts run here (floor). Within budget, exceptions are recorded on their group.
        after_each: called with each finished group (sync or async); returns a group, None (drop it)
            or a list of groups.
        max_concurrency: at most this many rollouts in flight (None: all at once).
        max_metrics: the progress bar shows the running means of at most this many trajectory
            metrics (None: all of them).
        pbar_total_completion_tokens: ART's (deprecated there); accepted and ignored.

    Returns the groups in input order (after_each's output in place of each group).
    Raises `GatherError` when more rollouts raise than the budget allows; `ConfigError` on bad args.
    """
    _check_args(max_exceptions, max_concurrency, after_each)
    if pbar_total_completion_tokens:
        warn_ignored("gather_trajectory_groups", ["pbar_total_completion_tokens"], "deprecated in ART too")
    groups = list(groups)
    for n, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup) and not inspect.isawaitable(group):
            raise TypeError(
                f"groups[{n}] is {type(group).__name__}; gather_trajectory_groups takes TrajectoryGroups, "
                "e.g. TrajectoryGroup(rollout(model, s) for _ in range(8)), or awaitables returning one. "
                "For a flat list of rollouts use gather_trajectories."
            )
    state = _Gathering(groups, max_exceptions, pbar_desc, max_concurrency, max_metrics)
    groups = state.groups
    results: list[list[TrajectoryGroup] | None] = [None] * len(groups)
    hooks: dict[asyncio.Task, int] = {}
    n_results = 0
    try:
        state.start()
        while n_results < len(groups):
            await state.wake.wait()
            state.wake.clear()
            if state.over_budget:
                raise state.budget_error()
            ready, state.ready = state.ready, []
            for g in ready:
                if after_each is None:
                    results[g] = [groups[g]]
                    n_results += 1
                else:
                    hook = asyncio.ensure_future(_call_after_each(after_each, groups[g], g))
                    hooks[hook] = g
                    hook.add_done_callback(lambda _t: state.wake.set())
            for hook in [h for h in hooks if h.done()]:
                g = hooks.pop(hook)
                results[g] = hook.result()  # re-raises after_each's error: the finally cancels the rest
                n_results += 1
    finally:
        # Runs on success (nothing left), on over-budget, on after_each errors and on cancellation.
        unfinished = [t for t in (*state.tasks, *hooks) if not t.done()]
        if unfinished:
            await state.cancel_all(hooks)
        state.progress.close()
    return [group for out in results for group in (out or [])]


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory] | Trajectory],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    after_each: Callable[[Trajectory], Any] | None = None,
    max_concurrency: int | None = None,
    pbar_total_completion_tokens: bool = False,
) -> list[Trajectory | BaseException]:
    """The flat version: run rollouts that are not grouped; return the results in input order.

    As in ART, a rollout that raised within the budget (`max_exceptions`) leaves its exception in its
    place in the returned list, so results line up with the inputs; with the default budget 0 the list
    holds only Trajectories. `after_each(trajectory)` runs once all rollouts are done and returns a
    Trajectory, None (drop) or a list of Trajectories; exceptions stay where they are.
    """
    _check_args(max_exceptions, max_concurrency, after_each)
    if pbar_total_completion_tokens:
        warn_ignored("gather_trajectories", ["pbar_total_completion_tokens"], "deprecated in ART too")
    items = list(trajectories)
    if not items:
        return []
    errors: dict[int, BaseException] = {}

    async def keep_error(i: int, item: Awaitable[Trajectory] | Trajectory) -> Trajectory:
        try:
            return await item if inspect.isawaitable(item) else item  # finished ones keep their place too
        except Exception as exc:
            errors[i] = exc
            raise

    wrapped = [keep_error(i, t) for i, t in enumerate(items)]
    [group] = await gather_trajectory_groups(
        [TrajectoryGroup(wrapped)], pbar_desc=pbar_desc, max_exceptions=max_exceptions,
        max_concurrency=max_concurrency,
    )
    done = iter(group.trajectories)
    results: list[Trajectory | BaseException] = [errors[i] if i in errors else next(done) for i in range(len(items))]
    if after_each is None:
        return results

    async def call(t: Trajectory | BaseException) -> Any:
        if isinstance(t, BaseException):
            return t
        out = after_each(t)
        return await out if inspect.isawaitable(out) else out

    outs = await asyncio.gather(*(call(t) for t in results))
    final: list[Trajectory | BaseException] = []
    for out in outs:
        for item in [] if out is None else out if isinstance(out, (list, tuple)) else [out]:
            if not isinstance(item, (Trajectory, BaseException)):
                raise TypeError(f"after_each returned {type(item).__name__}; expected a Trajectory, None or a list")
            final.append(item)
    return final


async def trajectory_group(
    trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]],
    *,
    exceptions: Iterable[BaseException | PydanticException] = (),
    metadata: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    logs: Iterable[str] | None = None,
    return_exceptions: bool = False,
) -> TrajectoryGroup:
    """Run the rollouts of one group and return it finished (ART 0.5's `art.trajectory_group`).

    return_exceptions=False: the first rollout error cancels the others and propagates.
    return_exceptions=True: every error is recorded on the group (`group.exceptions`) and the
    others finish.
    """
    group = TrajectoryGroup(trajectories, exceptions=exceptions, metadata=metadata, metrics=metrics,
                            logs=logs or ())
    budget = len(group.pending) if return_exceptions else 0
    [done] = await gather_trajectory_groups([group], pbar_desc=None, max_exceptions=budget)
    return done
