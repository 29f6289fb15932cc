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
  call runs (ART's test: failures / rollouts <= the fraction). Within budget, an exception is recorded on its group (`PydanticException`: type,
  message, traceback) and counted; one more and every unfinished rollout is cancelled and
  `GatherError` says how many failed of how many, with the first traceback.
- A rollout returns a `Trajectory`, or an iterable of them (ART's ``Awaitable[Iterable[Trajectory]]``:
  self-play, one game and a trajectory per player); its group holds them all, in rollout order.
  Anything else is a bug in the rollout: `RolloutResultError` at once, whatever the budget, since
  recording it on the group would silently drop the episode.
- Every rollout has a timeout (`rollout_timeout_s`, default `ROLLOUT_TIMEOUT_S` = 10 minutes, None
  for none), counted from when it starts (after `max_concurrency` lets it), less the time an engine of
  this process could not serve (paused for an update, or full: rollout/stalls.py). Past it the rollout is
  cancelled and a `RolloutTimeoutError` naming the setting and where the rollout was waiting counts
  against the budget like any exception: one hung request can no longer hang a run silently. The
  slot is decided at the deadline, so a rollout that ignores its cancellation cannot hang the gather
  either (it is left running, with a warning).
- Before that, a rollout that makes no progress for `hang_after_s` (default `HANG_AFTER_S`, 2 minutes) is
  named in a warning: its scenario, group, last request and that request's age, its task's stack
  (rollout/hangs.py says what progress is). The timeout then applies unchanged.
- A group may also be given as an awaitable that returns a `TrajectoryGroup` (ART's declared type,
  e.g. a coroutine that builds and awaits its own group). It runs as one task; if it raises, the
  exception counts against the budget like a rollout's and is recorded on an empty group in its place.
  A group such a coroutine awaits shares this gather's budget (`enclosing_gather_budget`, as ART's
  context): its failed rollouts are counted here and, within the budget, recorded on it, its other
  rollouts kept.
- `after_each(group)` runs as soon as that group's rollouts are done (while others still run), so a
  judge scores early groups while late ones play. It may return the group, a replacement, None (drop)
  or a list of groups. Its own errors are not budgeted: they cancel the rest and propagate.
- Cancellation (Ctrl-C under `asyncio.run`, or the caller cancelling) cancels every pending rollout
  and waits for them to finish cancelling before it propagates, so no task is left pending and no
  coroutine is left un-awaited.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Union

from groupwise.core.compat import warn_ignored
from groupwise.config import HANG_AFTER_S, ROLLOUT_TIMEOUT_S
from groupwise.errors import ArgumentTypeError, GatherError, RolloutResultError, RolloutTimeoutError
from groupwise.rollout.hangs import Activity, HangReport, HangWatch
from groupwise.rollout.limits import CANCEL_GRACE_S, check_gather_args, exception_budget, waiting_at
from groupwise.rollout.progress import GatherProgress
from groupwise.rollout.stalls import STALLS
from groupwise.core.trajectory import (
    PydanticException,
    Trajectory,
    TrajectoryGroup,
    enclosing_gather_budget,
    rollout_trajectories,
    set_completion_tokens,
)

__all__ = ["gather_trajectory_groups", "gather_trajectories", "exception_budget",
           "trajectory_group", "ROLLOUT_TIMEOUT_S"]

log = logging.getLogger(__name__)

AfterEach = Callable[[TrajectoryGroup], Union[TrajectoryGroup, None, list, Awaitable[Any]]]

class _Gathering:
    """The state of one gather call: the groups, their result slots, the counters, the tasks."""

    def __init__(self, groups: list[TrajectoryGroup | Awaitable[TrajectoryGroup]], max_exceptions: int | float,
                 pbar_desc: str | None, max_concurrency: int | None, max_metrics: int | None = None,
                 rollout_timeout_s: float | None = None, hang_after_s: float | None = None,
                 on_hang: Callable[[HangReport], Any] | None = None) -> None:
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
        self.timeout = rollout_timeout_s
        # slots[g][i]: the i-th rollout's result (a Trajectory, or a self-play rollout's list), None
        # while running or when it failed; failures[(g, i)]: the exception of a failed one.
        self.slots: list[list[Trajectory | list[Trajectory] | None]] = [[None] * len(p) for p in self.pending]
        self.failures: dict[tuple[int, int], BaseException] = {}
        self.remaining = [len(p) for p in self.pending]
        self.n_failed = 0
        self.first_failure: BaseException | None = None
        self.over_budget = False
        self.fatal: BaseException | None = None  # a rollout's bug (wrong result type): raised at once
        self.progress = GatherProgress(pbar_desc, self.total, max_metrics)
        self.semaphore = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        self.tasks: list[asyncio.Task] = []
        # (deadline, task, g, i) in start order, which is deadline order (one timeout for all): one timer
        # for the earliest deadline costs less per rollout than a timer each. Deadlines are on the
        # rollout clock (rollout/stalls.py), which stands still while a shared engine cannot serve.
        self.deadlines: collections.deque[tuple[float, asyncio.Task, int, int]] = collections.deque()
        self.watchdog: asyncio.TimerHandle | None = None
        self.expired: dict[asyncio.Task, tuple[int, int]] = {}  # timed-out tasks, maybe still running
        # Groups whose rollouts are all done, in completion order; `wake` is set when one is added.
        self.ready: list[int] = []
        self.wake = asyncio.Event()
        then = (f"If it stays so, rollout_timeout_s={self.timeout:g} from its start cancels it and it counts against "
                "max_exceptions." if self.timeout is not None else
                "rollout_timeout_s is None: nothing will end it; cancel the run or give the gather a timeout.")
        self.hangs = HangWatch(hang_after_s, on_hang, then=then)
        self.activity_of: dict[asyncio.Task, Activity] = {}  # what a timed-out rollout asked last

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        # every task copies this context when created: a group a rollout awaits charges this budget
        token = enclosing_gather_budget.set(self.charge)
        try:
            self._start_tasks(loop)
        finally:
            enclosing_gather_budget.reset(token)
        if self.ready:
            self.wake.set()

    def _start_tasks(self, loop: asyncio.AbstractEventLoop) -> None:
        for g, awaitables in enumerate(self.pending):
            if not awaitables:
                self.ready.append(g)
                continue
            for i, awaitable in enumerate(awaitables):
                activity = self.hangs.activity("rollout", self._what(g, i), group=g, source=awaitable)
                if self.semaphore is not None:
                    task = self.hangs.create_task(self._limited(awaitable, g, i, activity), activity, start=False)
                else:
                    task = self.hangs.create_task(
                        awaitable if inspect.iscoroutine(awaitable) else _as_coroutine(awaitable), activity)
                    self._start_timer(task, g, i)
                self.activity_of[task] = activity
                task.add_done_callback(self._callback(g, i))
                self.tasks.append(task)

    def charge(self, exc: BaseException) -> bool:
        """A rollout of a group that one of this gather's rollouts awaits itself failed
        (`enclosing_gather_budget`): count it against the budget. True while the budget allows it (the
        group records it); False once past it, and the gather fails as for any rollout."""
        if self.over_budget or self.fatal is not None:
            return False
        self.n_failed += 1
        if self.first_failure is None:
            self.first_failure = exc
        if self.n_failed > self.budget:
            self.over_budget = True
            self.wake.set()
            return False
        return True

    def _start_timer(self, task: asyncio.Task, g: int, i: int) -> None:
        if self.timeout is not None:
            self.deadlines.append((STALLS.rollout_time() + self.timeout, task, g, i))
            if self.watchdog is None:
                self._arm()

    def _arm(self) -> None:
        while self.deadlines and self.deadlines[0][1].done():
            self.deadlines.popleft()
        if not self.deadlines:
            self.watchdog = None
            return
        # While an engine stalls the rollout clock stands still, and a deadline just ahead stays just
        # ahead: look again at most four times per timeout (and once a second), not in a busy loop.
        wait = max(self.deadlines[0][0] - STALLS.rollout_time(), min(1.0, self.timeout / 4))
        self.watchdog = asyncio.get_running_loop().call_later(wait, self._check)

    def _check(self) -> None:
        now = STALLS.rollout_time()
        while self.deadlines and (self.deadlines[0][1].done() or self.deadlines[0][0] <= now):
            _, task, g, i = self.deadlines.popleft()
            if not task.done():
                self._expire(task, g, i)
        self._arm()

    def stop_watchdog(self) -> None:
        self.hangs.stop()
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None
        self.deadlines.clear()

    def _what(self, g: int, i: int) -> str:
        if g in self.producers:
            return f"group {g} (an awaitable that builds its group)"
        index = self.groups[g].metadata.get("scenario_index")
        return f"rollout {i} of group {g}" + (f" (scenario_index {index})" if index is not None else "")

    async def _limited(self, awaitable: Awaitable[Trajectory], g: int, i: int, activity: Activity) -> Trajectory:
        started = False
        try:
            async with self.semaphore:  # type: ignore[union-attr]
                started = True
                self._start_timer(asyncio.current_task(), g, i)  # the clock runs from the rollout's start
                activity.start(asyncio.current_task())  # so does the hang watch's
                return await awaitable
        finally:
            if not started and inspect.iscoroutine(awaitable):
                awaitable.close()  # cancelled while queued: the rollout never ran, close it quietly

    def _expire(self, task: asyncio.Task, g: int, i: int) -> None:
        """The rollout's deadline passed: decide its slot now (a failure) and cancel it. Its task may
        ignore the cancellation; the slot is already decided, so that cannot hang the gather."""
        if task.done() or self.over_budget or self.fatal is not None:
            return
        what = f"group {g} (an awaitable that builds its group)" if g in self.producers else f"rollout {i} of group {g}"
        where = waiting_at(task)
        exc = RolloutTimeoutError(
            f"{what} did not finish within rollout_timeout_s={self.timeout:g} and was cancelled; "
            "it counts against max_exceptions like a rollout that raised. If such rollouts are legitimately "
            "this slow, raise the timeout (LoopConfig.rollout_timeout_s, or the rollout_timeout_s argument "
            "of the gather functions; None waits forever)."
            + self._last_request(task)
            + (f" It was waiting at:\n{where}" if where else "")
        )
        self.expired[task] = (g, i)
        task.cancel()
        self._fail(g, i, exc)

    def _last_request(self, task: asyncio.Task) -> str:
        a = self.activity_of.get(task)
        if a is None or a.last_request is None or a.last_request_at is None:
            return ""
        age = STALLS.rollout_time() - a.last_request_at
        return (f" Its last model request: {a.last_request}, sent {age:.1f} s before, "
                f"{'never answered' if a.in_flight else 'answered'}.")

    def _callback(self, g: int, i: int) -> Callable[[asyncio.Task], None]:
        def on_done(task: asyncio.Task) -> None:
            exc: BaseException | None
            if task.cancelled():
                exc = asyncio.CancelledError("the rollout was cancelled (not by gather)")
            else:
                exc = task.exception()  # also marks it retrieved: no "never retrieved" warning
            if self.over_budget or self.fatal is not None or task in self.expired:
                return  # being torn down, or its slot was decided at its deadline
            if exc is not None:
                self._fail(g, i, exc)
                return
            result = task.result()
            if g in self.producers:
                if not isinstance(result, TrajectoryGroup) or result.pending:
                    self._fatal(TypeError(
                        f"groups[{g}] is an awaitable that returned {type(result).__name__}"
                        f"{' with rollouts never run' if isinstance(result, TrajectoryGroup) else ''}; "
                        "an awaitable group must return a finished TrajectoryGroup"
                    ))
                    return
                self.groups[g] = result
                set_completion_tokens(result.trajectories)
                self.progress.done(result.trajectories)
            else:
                try:
                    checked = rollout_trajectories(result, f"rollout {i} of group {g}")
                except RolloutResultError as bug:
                    self._fatal(bug)
                    return
                except Exception as exc:  # a generator it returned raised while read: the rollout failed
                    self._fail(g, i, exc)
                    return
                finished = [checked] if isinstance(checked, Trajectory) else checked
                set_completion_tokens(finished)
                self.slots[g][i] = checked
                self.progress.done(finished)
            self._finish_one(g)

        return on_done

    def _fail(self, g: int, i: int, exc: BaseException) -> None:
        self.n_failed += 1
        self.failures[g, i] = exc
        self.progress.done(None)
        if self.first_failure is None:
            self.first_failure = exc
        if self.n_failed > self.budget:
            self.over_budget = True
            self.wake.set()
            return
        self.groups[g].exceptions.append(PydanticException.from_exception(exc))
        self._finish_one(g)

    def _fatal(self, exc: BaseException) -> None:
        self.fatal = exc
        self.wake.set()

    def _finish_one(self, g: int) -> None:
        self.remaining[g] -= 1
        if self.remaining[g] == 0:
            group = self.groups[g]
            for result in self.slots[g]:
                if isinstance(result, Trajectory):
                    group.trajectories.append(result)
                elif result is not None:
                    group.trajectories.extend(result)
            self.ready.append(g)
            self.wake.set()

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
            f"The unfinished rollouts were cancelled. Fix the rollout, or raise max_exceptions (in gw.fit: "
            f"gw.LoopConfig(max_exceptions=0.1) lets a tenth fail) to record failures on their groups "
            f"instead.\nFirst exception:\n{first.traceback}"
        )
        recorded = [e for g in self.groups for e in g.exceptions] + [first]
        err = GatherError(message, exceptions=recorded)
        err.__cause__ = exc
        return err

    async def cancel_all(self, extra: Iterable[asyncio.Task] = ()) -> None:
        """Cancel every unfinished task and wait until each has finished cancelling (except timed-out
        rollouts that ignore their cancellation: waiting on those is the hang the timeout prevents)."""
        self.stop_watchdog()
        tasks = [t for t in (*self.tasks, *extra) if not t.done()]
        for t in tasks:
            t.cancel()
        waited = [t for t in tasks if t not in self.expired]
        if waited:
            # shield-free wait; a second Ctrl-C while waiting propagates, which is what the user asked.
            await asyncio.wait(waited)
        cancelling = [t for t in self.expired if not t.done()]
        if cancelling:  # a rollout that obeys its cancellation ends within a few turns of the loop
            await asyncio.wait(cancelling, timeout=CANCEL_GRACE_S)
        stuck = [f"{g}/{i}" for t, (g, i) in self.expired.items() if not t.done()]
        if stuck:
            log.warning("timed-out rollouts %s (group/rollout) ignored their cancellation and still run in "
                        "the background; a rollout should let asyncio.CancelledError propagate", ", ".join(stuck))


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
            raise ArgumentTypeError(
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
    rollout_timeout_s: float | None = ROLLOUT_TIMEOUT_S,
    hang_after_s: float | None = HANG_AFTER_S,
    on_hang: Callable[[HangReport], Any] | None = None,
) -> list[TrajectoryGroup]:
    """Run every pending rollout of every group concurrently and return the finished groups.

    Args:
        groups: `TrajectoryGroup`s built from rollout awaitables, or already finished, or awaitables
            (coroutines) that return a finished `TrajectoryGroup`. A rollout returns a Trajectory or an
            iterable of them (self-play); the group holds them all.
        pbar_desc: the progress bar's label; None disables the bar.
        max_exceptions: how many rollouts may raise (or time out): an int count, or a float fraction in
            (0, 1) of the rollouts run here (floor). Within budget, exceptions are recorded on their group.
        after_each: called with each finished group (sync or async); returns a group, None (drop it)
            or a list of groups.
        max_concurrency: at most this many rollouts in flight (None: all at once).
        max_metrics: the progress bar shows the running means of at most this many trajectory
            metrics (None: all of them).
        pbar_total_completion_tokens: ART's (deprecated there); accepted and ignored.
        rollout_timeout_s: seconds each rollout may run (a group given as an awaitable: the whole
            group) before it is cancelled and counted as an exception; None: no limit.
        hang_after_s: seconds a rollout may make no progress (no request through `model.openai_client()`
            sent or answered, no `note_progress()`) before it is named in a warning (rollout/hangs.py);
            it is not cancelled for it. None: no watch.
        on_hang: called with each `HangReport` instead of the warning, e.g. to log and record it.

    Returns the groups in input order (after_each's output in place of each group).
    Raises `GatherError` when more rollouts raise than the budget allows; `RolloutResultError` when a
    rollout returns something that is not a Trajectory (or an iterable of them); `ConfigError` on bad args.
    """
    check_gather_args(max_exceptions, max_concurrency, after_each, rollout_timeout_s, hang_after_s)
    if pbar_total_completion_tokens:
        warn_ignored("gather_trajectory_groups", ["pbar_total_completion_tokens"], "deprecated in ART too")
    groups = list(groups)
    for n, group in enumerate(groups):
        if not isinstance(group, TrajectoryGroup) and not inspect.isawaitable(group):
            raise ArgumentTypeError(
                f"groups[{n}] is {type(group).__name__}; gather_trajectory_groups takes TrajectoryGroups, "
                "e.g. TrajectoryGroup(rollout(model, s) for _ in range(8)), or awaitables returning one. "
                "For a flat list of rollouts use gather_trajectories."
            )
    state = _Gathering(groups, max_exceptions, pbar_desc, max_concurrency, max_metrics, rollout_timeout_s,
                       hang_after_s, on_hang)
    return await _run(state, after_each)


async def _run(state: _Gathering, after_each: AfterEach | None) -> list[TrajectoryGroup]:
    groups = state.groups
    results: list[list[TrajectoryGroup] | None] = [None] * len(groups)
    hooks: dict[asyncio.Task, int] = {}
    n_results = 0
    try:
        state.start()
        while n_results < len(groups):
            await state.wake.wait()
            state.wake.clear()
            if state.fatal is not None:
                raise state.fatal
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
        state.stop_watchdog()
        unfinished = [t for t in (*state.tasks, *hooks) if not t.done()]
        if unfinished:
            await state.cancel_all(hooks)
        state.progress.close()
    return [group for out in results for group in (out or [])]


async def _ready(item: Any) -> Any:
    return item


async def gather_trajectories(
    trajectories: Iterable[Awaitable[Trajectory] | Awaitable[Iterable[Trajectory]] | Trajectory],
    *,
    pbar_desc: str | None = "gather",
    max_exceptions: int | float = 0,
    after_each: Callable[[Trajectory], Any] | None = None,
    max_concurrency: int | None = None,
    pbar_total_completion_tokens: bool = False,
    rollout_timeout_s: float | None = ROLLOUT_TIMEOUT_S,
    hang_after_s: float | None = HANG_AFTER_S,
    on_hang: Callable[[HangReport], Any] | None = None,
) -> list[Trajectory | list[Trajectory] | BaseException]:
    """The flat version: run rollouts that are not grouped; return the results in input order.

    As in ART, each input's result is in its place: a Trajectory, or the list of Trajectories of a
    rollout that returned several (self-play), or, for a rollout that raised or timed out within the
    budget (`max_exceptions`), its exception; with the default budget 0 there are no exceptions.
    `after_each(trajectory)` runs once all rollouts are done, on each Trajectory (inside a list too),
    and returns a Trajectory, None (drop) or a list of Trajectories; exceptions stay where they are.
    """
    check_gather_args(max_exceptions, max_concurrency, after_each, rollout_timeout_s, hang_after_s)
    if pbar_total_completion_tokens:
        warn_ignored("gather_trajectories", ["pbar_total_completion_tokens"], "deprecated in ART too")
    items = list(trajectories)
    if not items:
        return []
    # finished ones keep their place too
    group = TrajectoryGroup([t if inspect.isawaitable(t) else _ready(t) for t in items])
    state = _Gathering([group], max_exceptions, pbar_desc, max_concurrency, rollout_timeout_s=rollout_timeout_s,
                       hang_after_s=hang_after_s, on_hang=on_hang)
    await _run(state, None)
    results = [state.failures.get((0, i), state.slots[0][i]) for i in range(len(items))]
    if after_each is None:
        return results  # type: ignore[return-value]

    async def call(t: Trajectory) -> list[Trajectory]:
        out = after_each(t)
        out = await out if inspect.isawaitable(out) else out
        kept = [] if out is None else list(out) if isinstance(out, (list, tuple)) else [out]
        for item in kept:
            if not isinstance(item, Trajectory):
                raise ArgumentTypeError(f"after_each returned {type(item).__name__}; expected a Trajectory, None "
                                        "or a list")
        return kept

    async def each(result: Any) -> list[Any]:
        if isinstance(result, BaseException):
            return [result]
        if isinstance(result, Trajectory):
            return await call(result)
        outs = await asyncio.gather(*(call(t) for t in result))
        return [[t for out in outs for t in out]]  # a self-play rollout's list stays one list

    outs = await asyncio.gather(*(each(r) for r in results))
    return [item for out in outs for item in out]


async def trajectory_group(
    trajectories: Iterable[Trajectory | BaseException | Awaitable[Trajectory]],
    *,
    exceptions: Iterable[BaseException | PydanticException] = (),
    metadata: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    logs: Iterable[str] | None = None,
    return_exceptions: bool = False,
    rollout_timeout_s: float | None = ROLLOUT_TIMEOUT_S,
    hang_after_s: float | None = HANG_AFTER_S,
) -> TrajectoryGroup:
    """Run the rollouts of one group and return it finished (ART 0.5's `art.trajectory_group`).

    return_exceptions=False: the first rollout error cancels the others and propagates.
    return_exceptions=True: every error (a timeout too) is recorded on the group (`group.exceptions`)
    and the others finish.
    """
    group = TrajectoryGroup(trajectories, exceptions=exceptions, metadata=metadata, metrics=metrics,
                            logs=logs or ())
    budget = len(group.pending) if return_exceptions else 0
    [done] = await gather_trajectory_groups([group], pbar_desc=None, max_exceptions=budget,
                                            rollout_timeout_s=rollout_timeout_s, hang_after_s=hang_after_s)
    return done
