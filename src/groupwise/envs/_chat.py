"""The one seam between an environment and a model: a chat completion that keeps the `Choice`.

Every env's rollout asks the model through `complete()`, so the request shape (sampling settings,
logprobs) is decided in one place. The returned `Choice` is appended to the trajectory as is: the
`token_ids` and `logprobs` our server attaches to it are what the trainer trains on
(token-in/token-out), so rollouts never rebuild an assistant message from text.

A "model" here is anything with ``openai_client()`` (an `openai.AsyncOpenAI`) and a ``name``; a
groupwise `TrainableModel` also has ``inference_name()`` (``"agent-001@3"``), which wins when present.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from groupwise.chat.text import LONE_SURROGATE
from groupwise.core.choices import wants_compact_token_data
from groupwise.errors import ArgumentTypeError, EnvError
from groupwise.core.trajectory import Choice, History, Message, Tools, Trajectory


class Sampling(BaseModel):
    """Sampling settings every scenario carries (the loop may override them per split)."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int = Field(32, gt=0, description="Most tokens the model may generate per turn.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature; 1.0 for training rollouts.")
    sampling_seed: int | None = Field(
        None,
        description="Passed as the request's `seed` (servers that honour it sample reproducibly). "
        "None for training: the N rollouts of a group must differ, or GRPO sees no advantage.",
    )
    logprobs: bool = Field(True, description="Get the sampled tokens' logprobs (the trainer needs them; some APIs "
                           "refuse them with tools): asked for, unless the model's client gets them anyway "
                           "(groupwise's, as plain lists: groupwise.core.choices.TOKEN_DATA_HEADER).")


# The reply seed of turn k is seed + TURN_SEED_STRIDE * k: one seed for every turn would replay the same
# random numbers in each reply.
TURN_SEED_STRIDE = 7919


def inference_name(model: Any) -> str:
    """The model name to put in requests: ``model.inference_name()`` when it exists, else ``model.name``."""
    get = getattr(model, "inference_name", None)
    if callable(get):
        return str(get())
    name = getattr(model, "name", None)
    if not name:
        raise ArgumentTypeError(
            f"{type(model).__name__} has neither inference_name() nor name; a rollout needs a model "
            "with openai_client() and a name (groupwise.TrainableModel or groupwise.Model)."
        )
    return str(name)


async def complete(
    model: Any,
    messages: Sequence[Message],
    sampling: Sampling,
    *,
    tools: Tools | None = None,
    tool_choice: str | dict[str, Any] | None = None,
) -> Choice:
    """One chat completion; returns its first `Choice` untouched (token ids and logprobs kept)."""
    client = model.openai_client()
    kwargs: dict[str, Any] = {
        "model": inference_name(model),
        "messages": [_sendable(m) for m in messages],
        "max_tokens": sampling.max_tokens,
        "temperature": sampling.temperature,
    }
    if sampling.logprobs and not _gets_logprobs_unasked(client):
        kwargs["logprobs"] = True
    if sampling.sampling_seed is not None:
        kwargs["seed"] = sampling.sampling_seed
    if tools:
        kwargs["tools"] = tools
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
    response = await client.chat.completions.create(**kwargs)
    if not response.choices:
        raise EnvError(
            f"the endpoint answered model {kwargs['model']!r} with no choices; check that the server "
            "serves this model name and returned a well-formed chat completion."
        )
    return response.choices[0]


def _gets_logprobs_unasked(client: Any) -> bool:
    """Whether `client` is groupwise's own (`model.openai_client()` of a trainable model): its requests get
    the logprobs as plain lists without asking, and asking would have them sent as one pydantic-validated
    entry per token, half of a request's cost on the client (groupwise.core.choices.TOKEN_DATA_HEADER)."""
    return wants_compact_token_data(getattr(client, "default_headers", None) or {})


def turn_sampling(sampling: Sampling, turn: int) -> Sampling:
    """The sampling settings of reply `turn` of an episode: a seeded episode draws each reply with its own
    seed (one seed for every turn would replay the same random numbers in each reply, so an episode's
    replies would agree with each other more than chance)."""
    if sampling.sampling_seed is None or turn == 0:
        return sampling
    return sampling.model_copy(update={"sampling_seed": sampling.sampling_seed + TURN_SEED_STRIDE * turn})


def choice_text(choice: Choice) -> str:
    """The assistant text of a Choice ("" when the model only called tools or said nothing)."""
    return choice.message.content or ""


def new_trajectory(system: str, user: str, *, tools: Tools | None = None) -> Trajectory:
    return Trajectory(
        messages_and_choices=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        tools=tools,
    )


def split_seeds(seed: int, n_train: int, n_val: int, n_test: int, *, offset: int = 0) -> tuple[list[int], list[int], list[int]]:
    """Disjoint game seeds for the three splits.

    Validation and test seeds do not depend on the run seed, so runs with different seeds are
    measured on the same held-out games; train seeds are drawn from a range that never overlaps them.
    """
    rng = random.Random(f"train-seeds:{seed}:{offset}")
    train = [rng.randrange(0, 1_000_000) + offset for _ in range(n_train)]
    val = [1_000_000 + offset + i for i in range(n_val)]
    test = [2_000_000 + offset + i for i in range(n_test)]
    return train, val, test


def _sendable(value: Any) -> Any:
    """A message with `sendable_text` in place of every string that holds a lone surrogate: an earlier
    reply (from an endpoint whose JSON escaped one) goes back in the next request, which the openai
    client could not encode. Anything else, the common case, is returned as it is."""
    if isinstance(value, str):
        return sendable_text(value) if LONE_SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {k: _sendable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sendable(v) for v in value]
    return value


def sendable_text(text: str) -> str:
    """`text` with each lone surrogate written as its escape (``\\ud800``), so it can be encoded as
    UTF-8: sent in a request (the openai client encodes the body as UTF-8 and raises on one), or handed
    to SQLite. A model's JSON can carry a lone surrogate (``"\\ud800"`` parses to one), and an error
    message that quotes the model's argument carries it on. Other text is returned unchanged."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _plain(message: Any) -> dict[str, Any]:
    if hasattr(message, "model_dump"):
        message = message.model_dump(exclude_none=True)
    return {k: v for k, v in dict(message).items() if v is not None}


def conversations(calls: list[tuple[list[Any], Any, Any]]) -> list[History]:
    """The conversations the env ran: each request's messages, then its Choice. A request that continues the
    previous one (its messages start with the previous request's and then the reply) extends it; one that
    does not (an env that rewrites its history) starts a new conversation."""
    histories: list[History] = []
    previous: list[dict[str, Any]] | None = None
    items: list[Any] = []
    tools = None
    for prompt, call_tools, choice in calls:
        messages = [_plain(m) for m in prompt]
        continues = (previous is not None and len(messages) > len(previous)
                     and messages[: len(previous)] == previous
                     and messages[len(previous)].get("role") == "assistant")
        if continues:
            items.extend(messages[len(previous) + 1:])
        else:
            if items:
                histories.append(History(messages_and_choices=items, tools=tools))
            items, tools = list(messages), call_tools or None
        items.append(choice)
        previous = messages
    if items:
        histories.append(History(messages_and_choices=items, tools=tools))
    return histories


def number_or_none(value: Any) -> float | None:
    """`value` as a float, or None where it is none (a score or metric an env left unset or non-numeric)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
