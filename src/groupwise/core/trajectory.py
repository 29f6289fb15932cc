"""The data model, and the map of groupwise.

The pipeline, with the module that owns each arrow::

    scenarios ─► rollout(model, scenario) ─► Trajectory            user code, groupwise.envs
                     │ model.openai_client()                       inference/ (engine + server)
                     ▼
    TrajectoryGroup (N rollouts of one scenario)                   this file
    gather_trajectory_groups: parallel, progress, exception budget rollout/gather.py
                     ▼
    rewards: code │ RULER judge │ hybrid                           judge/
                     ▼
    GRPO trainer on a LoRA adapter ─► new adapter served           training/, backend/
                     ▼
    run store (lossless trajectories, history, checkpoints)        store.py
    loop: validation, stopping, hacking detectors, plots           loop/

A `Trajectory` is one episode: the chat messages the agent saw and the `Choice`s it sampled.
Choices are kept exactly as the `openai` SDK returned them, extra fields included, so the
token ids and logprobs our server attaches (`choice.token_ids`, `choice.logprobs` or
`choice.token_logprobs`, and `choice.forced_token_indices`) survive to the trainer (token-in/token-out)
and to the store (lossless).
(`groupwise.core.choices` reads them, and says how groupwise's own clients receive them).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import math
import time
import traceback as traceback_module
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal, Union

from openai.types.chat.chat_completion import Choice
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictBool,
    StrictFloat,
    StrictInt,
    Tag,
    ValidationInfo,
    field_validator,
)

from groupwise.core.choices import choice_policy_versions, choice_to_message, completion_tokens

__all__ = [
    "Choice",
    "History",
    "Message",
    "MessageOrChoice",
    "Messages",
    "MessagesAndChoices",
    "PydanticException",
    "Tools",
    "Trajectory",
    "TrajectoryGroup",
    "enclosing_gather_budget",
    "item_kind_problem",
    "set_completion_tokens",
]

# ART's `art.types` also holds the step's configs and results; a ported ``from art.types import
# TrainConfig`` finds them here, resolved on first use so that this module loads neither.
_ART_TYPES_ELSEWHERE = {"TrainConfig": "groupwise.config", "TrainSFTConfig": "groupwise.config",
                        "TrainResult": "groupwise.backend.base", "LocalTrainResult": "groupwise.backend.base",
                        "ServerlessTrainResult": "groupwise.backend.base"}
Verbosity = Literal[0, 1, 2]  # ART's type of `verbose=` (groupwise reads it as a bool)


def __getattr__(name: str) -> Any:
    module = _ART_TYPES_ELSEWHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'groupwise.core.trajectory' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


VALID_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

Message = dict[str, Any]
"""A plain chat message as the `openai` SDK takes it: ``{"role": ..., "content": ...}``."""

Messages = list[Message]
"""A list of plain chat messages (ART's `art.Messages`)."""

Tools = list[dict[str, Any]]
"""OpenAI tool definitions: ``[{"type": "function", "function": {...}}]``."""

MetricValue = Union[StrictBool, StrictInt, StrictFloat]
# Any value, as ART 0.5.23's metadata takes (earlier ART: scalars): nested dicts and lists are stored as the
# JSON they are; a value JSON cannot hold is stored as its repr() with one warning (groupwise.runs.store).
MetadataValue = Any


def _plain_scalars(values: Any, field: str) -> Any:
    """numpy scalars (np.float32(0.5), np.int64(3), np.bool_(True)) as the Python scalars they hold;
    a metric computed with numpy is a number like any other. Checked by module name: no numpy import.
    A metric given as text is refused with what to do (pydantic's own error lists three union members):
    it is averaged and charted, and "0.8" parsed leniently would be a bug in the rollout hidden."""
    if not isinstance(values, dict):
        return values
    plain = {k: v.item() if type(v).__module__ == "numpy" and hasattr(v, "item") else v for k, v in values.items()}
    text = {k: v for k, v in plain.items() if isinstance(v, (str, bytes)) and field == "metrics"}
    if text:
        raise ValueError(f"metrics {text!r} are text; a metric must be a number or a bool. Convert it in the "
                         "rollout (e.g. float(value)), or keep text in metadata.")
    return plain


def _message_or_choice_kind(value: Any) -> str:
    # A Choice serialised to JSON is a dict too; it is told apart by the keys only a Choice has.
    if isinstance(value, Choice):
        return "choice"
    if isinstance(value, dict) and "message" in value and "finish_reason" in value:
        return "choice"
    return "message"


MessageOrChoice = Annotated[
    Union[Annotated[Choice, Tag("choice")], Annotated[Message, Tag("message")]],
    Discriminator(_message_or_choice_kind),
]
MessagesAndChoices = list[MessageOrChoice]


def item_kind_problem(item: Any) -> str | None:
    """What to append instead of `item`, when it is neither a message dict nor a Choice; else None."""
    if isinstance(item, (dict, Choice)):
        return None
    kind = type(item).__name__
    if kind == "ChatCompletionMessage":
        fix = ("append the Choice, response.choices[0]: its sampled tokens are what training reads "
               "(a message dict, .model_dump(), would be context only, never trained)")
    elif kind in ("ChatCompletion", "ModelResponse"):
        fix = "append its Choice, response.choices[0]"
    elif kind == "Choices":  # LiteLLM's
        fix = "convert LiteLLM's choice with groupwise.utils.litellm.convert_litellm_choice_to_openai"
    else:
        fix = "append a message dict ({'role': ..., 'content': ...}) or the Choice a chat completion returned"
    return f"is a {kind}; {fix}"


def _item_kinds(items: Any, field: str) -> Any:
    """Before validation: an item that is neither a message dict nor a Choice gets a message that says
    what to append instead (pydantic's own says only "Input should be a valid dictionary")."""
    if isinstance(items, list):
        for i, item in enumerate(items):
            problem = item_kind_problem(item)
            if problem:
                raise ValueError(f"{field}[{i}] {problem}")
    return items


def _check_messages(items: list[Any], field: str) -> list[Any]:
    for i, item in enumerate(items):
        if isinstance(item, Choice):
            continue
        role = item.get("role")
        if role not in VALID_ROLES:
            raise ValueError(
                f"{field}[{i}] has role {role!r}; expected one of {sorted(VALID_ROLES)}"
            )
    return items


def plain_messages(messages_and_choices: list[Any]) -> list[Message]:
    """Every Choice as its assistant message (its tool calls kept), and content that is None as "", as
    ART 0.4+'s ``messages()`` writes it (code written for ART calls string methods on it). The server
    and the trainer render None and "" alike (chat/tool_calls.py), so the tokens do not change."""
    out: list[Message] = []
    for m in messages_and_choices:
        message = choice_to_message(m) if isinstance(m, Choice) else m
        if isinstance(message, dict) and message.get("content") is None:
            message = {**message, "content": ""}
        out.append(message)
    return out


def _same_data(a: Any, b: Any) -> bool:
    """Whether `a` (validated) holds exactly what `b` (given) holds: equal, with the same types all the
    way down (a numpy scalar that validation made a float is a change)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_data(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_data(a[k], b[k]) for k in a)
    return a is b or a == b


class History(BaseModel):
    """A side conversation of a trajectory: a sub-agent, a summariser, a tool's own LLM call."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    messages_and_choices: MessagesAndChoices
    tools: Tools | None = None

    @field_validator("messages_and_choices")
    @classmethod
    def _roles(cls, v: list[Any]) -> list[Any]:
        return _check_messages(v, "messages_and_choices")

    @field_validator("messages_and_choices", mode="before")
    @classmethod
    def _kinds(cls, v: Any) -> Any:
        return _item_kinds(v, "messages_and_choices")

    def messages(self) -> list[Message]:
        """Plain chat messages (`plain_messages`)."""
        return plain_messages(self.messages_and_choices)


class Trajectory(BaseModel):
    """One episode: what the agent saw, what it sampled, and how well it did."""

    model_config = ConfigDict(validate_assignment=True)

    messages_and_choices: MessagesAndChoices = Field(default_factory=list)
    tools: Tools | None = None
    additional_histories: list[History] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, MetricValue] = Field(default_factory=dict)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    initial_policy_version: int | None = None
    final_policy_version: int | None = None
    _start_time: float = PrivateAttr(default_factory=time.monotonic)

    @field_validator("messages_and_choices")
    @classmethod
    def _roles(cls, v: list[Any]) -> list[Any]:
        return _check_messages(v, "messages_and_choices")

    @field_validator("messages_and_choices", mode="before")
    @classmethod
    def _kinds(cls, v: Any) -> Any:
        return _item_kinds(v, "messages_and_choices")

    @field_validator("metrics", "metadata", mode="before")
    @classmethod
    def _numpy_scalars(cls, v: Any, info: ValidationInfo) -> Any:
        return _plain_scalars(v, info.field_name)

    @field_validator("reward", mode="before")
    @classmethod
    def _numeric_reward(cls, v: Any) -> Any:
        # pydantic's lax float would parse "1.0"; a reward that is text is a bug in the reward function
        # (a judge's raw answer, a regex group), and "nan" would slip past as a float. Numbers only;
        # bools stay allowed (reward=is_correct is common in ported ART code).
        if isinstance(v, (str, bytes, bytearray)):
            raise ValueError(f"reward is the {type(v).__name__} {v!r}; a reward must be a number. Convert it in "
                             "the reward function (e.g. float(answer)) and check it parses.")
        return v.item() if type(v).__module__ == "numpy" and hasattr(v, "item") else v

    @field_validator("reward")
    @classmethod
    def _finite_reward(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError(
                f"reward is {v}; a reward must be a finite number. Check the reward function "
                "(a division by zero or a log of 0 gives inf/nan)."
            )
        return v

    def __setattr__(self, name: str, value: Any) -> None:
        # Assignments are validated (a text reward or an inf is refused), and pydantic's validation
        # stores a copy of a list or dict. ART's Trajectory stores the object itself, so a program that
        # assigns `messages` and then appends its turns to `messages` trains on them there; here the
        # turns went to a copy the trajectory never saw. When validation changed nothing but the
        # object's identity, the caller's object is kept, as in ART.
        super().__setattr__(name, value)
        if isinstance(value, (list, dict)) and name in type(self).model_fields:
            stored = self.__dict__.get(name)
            if stored is not value and _same_data(stored, value):
                self.__dict__[name] = value

    def messages(self) -> list[Message]:
        """Plain chat messages (`plain_messages`): what to send on as the next turn's context."""
        return plain_messages(self.messages_and_choices)

    def log(self, message: str) -> None:
        """Append a line to this trajectory's logs (stored with it, shown by `groupwise inspect`)."""
        self.logs.append(str(message))

    def finish(self) -> "Trajectory":
        """Record the episode's duration in ``metrics["duration"]`` (seconds) and return self."""
        self.metrics["duration"] = time.monotonic() - self._start_time
        return self

    @asynccontextmanager
    async def track_duration(self, metric_name: str) -> AsyncIterator[None]:
        """Add the seconds spent in the block to ``metrics[f"{metric_name}_duration"]`` (as ART's)."""
        start = time.monotonic()
        try:
            yield
        finally:
            key = f"{metric_name}_duration"
            self.metrics[key] = float(self.metrics.get(key, 0.0)) + time.monotonic() - start

    def __str__(self) -> str:  # ART's: a printed trajectory is its scores, not its whole conversation
        return f"Trajectory(reward={self.reward}, metrics={self.metrics}, metadata={self.metadata})"

    def for_logging(self) -> dict[str, Any]:
        """ART's console view: the scores, logs and tools, and each message with ``trainable`` (sampled)."""
        messages = [{**m.message.to_dict(), "trainable": True} if isinstance(m, Choice) else {**m, "trainable": False}
                    for m in self.messages_and_choices]
        return {"reward": self.reward, "initial_policy_version": self.initial_policy_version,
                "final_policy_version": self.final_policy_version, "metrics": self.metrics,
                "metadata": self.metadata, "messages": messages, "tools": self.tools, "logs": self.logs}

    def __eq__(self, other: object) -> bool:
        # Equal when every stored field is equal; the private start time is not part of the record.
        if not isinstance(other, Trajectory):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    __hash__ = None  # type: ignore[assignment]

    def choices(self) -> list[Choice]:
        return [m for m in self.messages_and_choices if isinstance(m, Choice)]

    def policy_versions(self) -> list[int]:
        """The policy version of every sampled token of the trajectory, its side conversations'
        included, in order (`choice_policy_versions`; choices from a server that did not say are left
        out): what an asynchronous loop reads to bound how stale a group is."""
        choices = [m for h in (self, *self.additional_histories) for m in h.messages_and_choices
                   if isinstance(m, Choice)]
        return [v for c in choices for v in (choice_policy_versions(c) or [])]


class PydanticException(BaseModel):
    """An exception kept as data, so it can be stored, shown and counted."""

    type: str
    message: str
    traceback: str

    @classmethod
    def from_exception(cls, exc: BaseException) -> "PydanticException":
        tb = "".join(traceback_module.format_exception(type(exc), exc, exc.__traceback__))
        try:
            message = str(exc)
        except Exception:  # a broken __str__ must not turn a recorded failure into a raised one
            message = f"<str() of the {type(exc).__name__} failed>"
        return cls(type=type(exc).__name__, message=message, traceback=tb)


def rollout_trajectories(result: Any, where: str) -> "Trajectory | list[Trajectory]":
    """A rollout's result, checked: a `Trajectory`, or a list of them (from any iterable of them: ART
    declares ``Awaitable[Iterable[Trajectory]]`` for a rollout that plays several roles, e.g. self-play,
    one game and a trajectory per player). Anything else raises `RolloutResultError` naming `where`:
    a bug in the rollout, which no exception budget should hide."""
    from groupwise.errors import RolloutResultError

    if isinstance(result, Trajectory):
        return result
    what = type(result).__name__
    # A group, a mapping or text is iterable too, but never a rollout's list of trajectories.
    if isinstance(result, Iterable) and not isinstance(result, (str, bytes, dict, BaseModel)):
        items = list(result)
        bad = next((k for k, t in enumerate(items) if not isinstance(t, Trajectory)), None)
        if bad is None:
            return items
        what = f"a {what} whose item {bad} is a {type(items[bad]).__name__}"
    raise RolloutResultError(
        f"{where} returned {what}, not a Trajectory or an iterable of Trajectories. A rollout must `return` "
        "the Trajectory it built (a rollout that plays several roles, as in self-play, a list of them). "
        "This is a bug in the rollout, so it is raised at once instead of being counted as a failed rollout."
    )


enclosing_gather_budget: contextvars.ContextVar[Callable[[BaseException], bool] | None] = contextvars.ContextVar(
    "groupwise_enclosing_gather_budget", default=None)
"""The exception budget of the gather a rollout runs in (`gather_trajectory_groups`, or ART's
`set_gather_context`), seen by a `TrajectoryGroup` awaited inside that rollout: called with a failed
rollout's exception, it counts the failure and says whether the gather's budget still allows it. ART's
groups read their gather's context the same way, so a coroutine that awaits its own group inside a
gather with ``max_exceptions=2`` keeps the group's other rollouts, as on ART. None outside a gather."""


def set_completion_tokens(trajectories: Iterable["Trajectory"]) -> None:
    """Set each trajectory's ``completion_tokens`` metric (`groupwise.core.choices.completion_tokens`), as ART's
    gather does on every trajectory it collects (also those of a group awaited on its own)."""
    for trajectory in trajectories:
        tokens = completion_tokens(trajectory.messages_and_choices)
        if tokens is not None:
            trajectory.metrics["completion_tokens"] = tokens


class TrajectoryGroup(BaseModel):
    """N rollouts of one scenario: the unit GRPO compares within.

    Built from finished trajectories, or from awaitables (coroutines of a rollout); a group
    of awaitables is awaited (``await group``) or handed to `gather_trajectory_groups`,
    which runs every rollout of every group concurrently under one exception budget. A rollout
    may return one Trajectory or an iterable of them (self-play: a trajectory per player); the
    group holds them all, flattened in the order the rollouts were given.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    trajectories: list[Trajectory] = Field(default_factory=list)
    exceptions: list[PydanticException] = Field(default_factory=list)
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    metrics: dict[str, MetricValue] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)

    _pending: list[Awaitable[Trajectory]] = PrivateAttr(default_factory=list)

    def __init__(
        self,
        trajectories_or_awaitables: Iterable[Trajectory | BaseException | Awaitable[Trajectory]] | None = None,
        /,
        *,
        exceptions: Iterable[PydanticException | BaseException] = (),
        metadata: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        logs: Iterable[str] = (),
        trajectories: Iterable[Trajectory] | None = None,
    ) -> None:
        items = list(trajectories_or_awaitables if trajectories_or_awaitables is not None else trajectories or [])
        done: list[Any] = []
        pending: list[Awaitable[Trajectory]] = []
        excs: list[Any] = [
            PydanticException.from_exception(e) if isinstance(e, BaseException) else e for e in exceptions
        ]
        for item in items:
            if isinstance(item, BaseException):
                excs.append(PydanticException.from_exception(item))
            elif inspect.isawaitable(item):
                pending.append(item)
            else:
                done.append(item)
        # An empty group is allowed (as in ART): a rollout step that produced nothing is a record too,
        # and it carries no learning signal, which the trainer reports.
        super().__init__(
            trajectories=done,
            exceptions=excs,
            metadata=dict(metadata or {}),
            metrics=dict(metrics or {}),
            logs=list(logs),
        )
        self._pending = pending

    @field_validator("metrics", "metadata", mode="before")
    @classmethod
    def _numpy_scalars(cls, v: Any, info: ValidationInfo) -> Any:
        return _plain_scalars(v, info.field_name)

    @property
    def pending(self) -> list[Awaitable[Trajectory]]:
        """Rollout awaitables not yet run (consumed by `gather_trajectory_groups`)."""
        return self._pending

    def take_pending(self) -> list[Awaitable[Trajectory]]:
        pending, self._pending = self._pending, []
        return pending

    def __await__(self):
        # Awaiting a group runs its rollouts concurrently. Outside a gather there is no exception budget
        # (fail loud): the first error cancels the others and propagates. Inside a rollout of a gather
        # (`enclosing_gather_budget`), each failure is charged to that gather's budget and, while it
        # allows, recorded on this group, the other rollouts finishing: ART's group does this with its
        # gather's context. Either way the trajectories get ART's `completion_tokens` metric.
        async def run() -> "TrajectoryGroup":
            charge = enclosing_gather_budget.get()
            tasks = [asyncio.ensure_future(a) for a in self.take_pending()]
            failed: list[BaseException] = []
            try:
                for next_done in asyncio.as_completed(tasks):
                    try:
                        await next_done
                    except Exception as exc:
                        if charge is None or not charge(exc):
                            raise
                        failed.append(exc)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            for n, task in enumerate(tasks):
                if task.exception() is not None:
                    continue
                checked = rollout_trajectories(task.result(), f"rollout {n} of the group")
                finished = [checked] if isinstance(checked, Trajectory) else checked  # self-play: in order
                set_completion_tokens(finished)
                self.trajectories.extend(finished)
            self.exceptions.extend(PydanticException.from_exception(e) for e in failed)
            return self

        return run().__await__()

    def __iter__(self):  # type: ignore[override]
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    def log(self, message: str) -> None:
        """Append a line to the group's logs (stored with it), as `Trajectory.log` does."""
        self.logs.append(str(message))
