"""Hang detection: name the rollout (or judge call) that has made no progress for `hang_after_s`.

"Training is stuck" was found by hand: the progress bar stops one short of the end, and nothing says
which of hundreds of rollouts is waiting, on what, or since when. The rollout timeout
(`rollout_timeout_s`, 10 minutes by default) ends such a rollout eventually, but says only where it
was when it ended, and only then. So each rollout (and each `score_group` call of the loop) runs with
an `Activity` record in a context variable, and a watch looks at them every fraction of `hang_after_s`:

- Progress is a model request sent or answered through a groupwise OpenAI client (`model.openai_client()`:
  its `request` notes both, in the calling task's context), the rollout starting, the judge returning,
  or an explicit `note_progress()` (an environment's step, a tool's result).
- One that has made none for `hang_after_s` (on the rollout clock of rollout/stalls.py, so a paused or
  full engine of this process is not the rollout's fault) is reported once per idle spell as a
  `HangReport`: what it is (rollout i of group g, its scenario: the rollout coroutine's arguments other
  than the model), how long it has been idle, its last request and that request's age (and whether it
  is still unanswered), and the stack of its task. The gather logs it as a warning; the loop logs it on
  its own logger (which ``groupwise train`` prints with the step lines) and records it as a ``hang``
  alert in the run's history, which the dashboard lists with the other alerts.
- Naming changes nothing else: the rollout's timeout then applies as before (cancelled and counted
  against ``max_exceptions``), so a rollout that is only slow is never cut by this setting.

An activity's notes also reach the activities around it (a rollout that gathers a group of its own),
so a parent that waits on busy children is not called hung.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import linecache
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from groupwise.rollout.limits import waiting_at
from groupwise.rollout.stalls import STALLS

__all__ = ["Activity", "HangReport", "HangWatch", "current_activity", "note_progress", "note_request",
           "note_answer", "describe_arguments"]

log = logging.getLogger(__name__)

_CURRENT: contextvars.ContextVar["Activity | None"] = contextvars.ContextVar("groupwise_activity", default=None)

# How much of an argument's repr a report keeps: enough to tell scenarios apart, not a page of JSON.
_REPR_CHARS = 200
# Frames of a task's await chain a report keeps (outermost first, as a traceback): the first few and
# the innermost ones, out of at most _MAX_CHAIN (an SDK call alone is a dozen deep).
_STACK_FRAMES = 12
_MAX_CHAIN = 200


@dataclass
class Activity:
    """The progress record of one rollout or judge call (`kind`), read by a `HangWatch`."""

    kind: str
    name: str
    group: int | None = None
    scenario: str | None = None
    parent: "Activity | None" = None
    source: Any = None  # the rollout's coroutine: its arguments name the scenario when reported
    task: asyncio.Task | None = None
    started: float | None = None  # rollout clock; None while queued (max_concurrency)
    last: float = 0.0
    last_request: str | None = None
    last_request_at: float | None = None
    in_flight: int = 0
    reported: bool = False
    done: bool = False

    def start(self, task: asyncio.Task | None) -> None:
        self.task = task
        self.started = self.last = STALLS.rollout_time()

    def progress(self) -> None:
        activity: Activity | None = self
        now = STALLS.rollout_time()
        while activity is not None:
            activity.last = now
            activity.reported = False
            activity = activity.parent


def current_activity() -> Activity | None:
    """The activity of the running rollout or judge call (None outside of one)."""
    return _CURRENT.get()


def note_progress() -> None:
    """Tell the hang watch that the current rollout made progress (an environment step returned, a
    tool answered). Requests through `model.openai_client()` are noted without it."""
    activity = _CURRENT.get()
    if activity is not None:
        activity.progress()


def note_request(description: str) -> None:
    """A model request is being sent (called by groupwise's OpenAI client)."""
    activity = _CURRENT.get()
    if activity is not None:
        activity.progress()
        activity.last_request, activity.last_request_at = description, activity.last
        activity.in_flight += 1


def note_answer() -> None:
    """The request noted last came back (answered or failed)."""
    activity = _CURRENT.get()
    if activity is not None:
        activity.in_flight = max(0, activity.in_flight - 1)
        activity.progress()


def describe_arguments(awaitable: Any) -> str | None:
    """A rollout coroutine's arguments, other than the model, as short reprs (its scenario), read before
    it runs (then its locals are its arguments). None for an awaitable that is not a coroutine."""
    if not inspect.iscoroutine(awaitable):
        return None
    try:
        arguments = inspect.getcoroutinelocals(awaitable)
    except Exception:
        return None
    code = awaitable.cr_code
    names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]  # not the locals it set since
    parts = []
    for name in names:
        if name not in arguments:
            continue
        value = arguments[name]
        if _is_model(value):
            continue
        text = repr(value)
        if len(text) > _REPR_CHARS:
            text = text[: _REPR_CHARS - 3] + "..."
        parts.append(f"{name}={text}")
    return ", ".join(parts) or None


def _is_model(value: Any) -> bool:
    return any(k.__name__ in ("Model", "AtStep") for k in type(value).__mro__)


@dataclass
class HangReport:
    """One activity found idle: what it is, since when, its last request, its stack."""

    kind: str
    name: str
    group: int | None
    scenario: str | None
    idle_s: float
    hang_after_s: float
    last_request: str | None
    last_request_age_s: float | None
    request_in_flight: bool
    stack: str
    then: str = ""  # what happens next (the timeout policy that applies), said by the one who watches

    def message(self) -> str:
        lines = [f"{self.name} has made no progress for {self.idle_s:.1f} s (hang_after_s={self.hang_after_s:g})"
                 + (f"; scenario: {self.scenario}" if self.scenario else "")]
        if self.last_request is None:
            lines.append("It made no model request through model.openai_client() yet.")
        else:
            state = "still unanswered" if self.request_in_flight else "answered"
            lines.append(f"Its last request: {self.last_request}, sent {self.last_request_age_s:.1f} s ago, {state}.")
        if self.then:
            lines.append(self.then)
        if self.stack:
            lines.append("Its task's stack:\n" + self.stack)
        return "\n".join(lines)

    def evidence(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "group": self.group, "scenario": self.scenario,
                "idle_s": round(self.idle_s, 3), "hang_after_s": self.hang_after_s,
                "last_request": self.last_request,
                "last_request_age_s": None if self.last_request_age_s is None else round(self.last_request_age_s, 3),
                "request_in_flight": self.request_in_flight, "stack": self.stack}


def task_stack(task: asyncio.Task | None) -> str:
    """The task's await chain, outermost first, with each line's source. `Task.print_stack` shows only
    the outermost frame of a suspended task, which says nothing of what it waits on."""
    if task is None or task.done():
        return ""
    frames = waiting_at(task, depth=_MAX_CHAIN).splitlines()
    if len(frames) > _STACK_FRAMES:  # the outer frames say who, the inner ones what it waits on
        head = _STACK_FRAMES // 3
        frames = [*frames[:head], f"  ... {len(frames) - _STACK_FRAMES} frames ...", *frames[head - _STACK_FRAMES:]]
    lines = []
    for line in frames:
        lines.append(line)
        filename, _, lineno = line.strip().rsplit(" in ", 1)[0].rpartition(":")  # "  path:line in name"
        source = linecache.getline(filename, int(lineno)).strip() if lineno.isdigit() else ""
        if source:
            lines.append(f"    {source}")
    return "\n".join(lines)


class HangWatch:
    """Watches activities; calls `on_hang(report)` once per idle spell of each (without one: a warning on
    this module's logger). A caller with its own channel (the loop: its logger, which `groupwise train`
    prints, and the history) reports there instead, so a hang is said once."""

    def __init__(self, hang_after_s: float | None, on_hang: Callable[[HangReport], Any] | None = None,
                 then: str = "") -> None:
        self.hang_after_s = hang_after_s
        self.on_hang = on_hang
        self.then = then
        self.activities: list[Activity] = []
        self.reports: list[HangReport] = []
        self._timer: asyncio.TimerHandle | None = None

    def activity(self, kind: str, name: str, *, group: int | None = None, scenario: str | None = None,
                 source: Any = None) -> Activity:
        """A new activity, parented to the current one, for a task about to be created."""
        activity = Activity(kind, name, group=group, scenario=scenario, parent=_CURRENT.get(), source=source)
        if self.hang_after_s is not None:
            self.activities.append(activity)
            if self._timer is None:
                self._arm()
        return activity

    def create_task(self, coro: Any, activity: Activity, *, start: bool = True) -> asyncio.Task:
        """Create the task in a context whose current activity is `activity` (started with it, or, with
        start=False, by the task itself once it really starts: `activity.start(current_task())`)."""
        token = _CURRENT.set(activity)
        try:
            task = asyncio.get_running_loop().create_task(coro)
        finally:
            _CURRENT.reset(token)
        if start:
            activity.start(task)
        return task

    def _arm(self) -> None:
        assert self.hang_after_s is not None
        self._timer = asyncio.get_running_loop().call_later(min(max(self.hang_after_s / 4, 0.01), 5.0), self._check)

    def _check(self) -> None:
        now = STALLS.rollout_time()
        self.activities = [a for a in self.activities if not a.done and not (a.task is not None and a.task.done())]
        for a in self.activities:
            if a.started is None or a.reported or now - a.last < self.hang_after_s:  # type: ignore[operator]
                continue
            a.reported = True
            self._report(a, now)
        self._timer = None
        if self.activities:
            self._arm()

    def _report(self, a: Activity, now: float) -> None:
        if a.scenario is None and a.source is not None:
            a.scenario = describe_arguments(a.source)  # read only now: a repr per rollout would cost
        report = HangReport(
            kind=a.kind, name=a.name, group=a.group, scenario=a.scenario, idle_s=now - a.last,
            hang_after_s=self.hang_after_s,  # type: ignore[arg-type]
            last_request=a.last_request,
            last_request_age_s=None if a.last_request_at is None else now - a.last_request_at,
            request_in_flight=a.in_flight > 0, stack=task_stack(a.task), then=self.then)
        self.reports.append(report)
        if self.on_hang is None:
            log.warning("%s", report.message())
        else:
            try:
                self.on_hang(report)
            except Exception:  # a broken listener must not take the watch (and the gather) down
                log.exception("on_hang raised while reporting %s", a.name)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.activities.clear()
