"""Recorded chat completions, and the conversations they make: what a rollout's model calls become
when they are captured below the agent's code (LangChain's chat model, `capture_auto_trajectory`).

Calls become conversations: a call whose messages start with an earlier conversation (its messages
and the assistant turn it sampled) continues it; any other call starts a new one (a sub-agent, a
router, a summariser). Messages are compared by what the model saw (role, text, tool calls with their
arguments parsed, tool_call_id), not by their JSON: a framework that sends a turn back re-serialises it
(spacing in the arguments, ``refusal: null`` and other fields the SDK adds), and that must not split one
conversation into two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from groupwise.core.choices import choice_to_message
from groupwise.core.trajectory import Choice, History

__all__ = ["ChatCall", "call_from_bodies", "conversations"]


@dataclass(frozen=True)
class ChatCall:
    """One chat completion: the messages and tools it was asked with, and the choice it returned."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    choice: Choice


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: compare their text
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _arguments(arguments: Any) -> Any:
    # LangChain parses a call's arguments and serialises them again when it sends the turn back,
    # so the spacing may differ from what the model wrote; the parsed value is what must match.
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def _key(message: dict[str, Any]) -> tuple:
    """What must be equal for a sent message to be the one an earlier call saw or sampled."""
    calls = tuple(
        (c.get("id"), (c.get("function") or {}).get("name"), json.dumps(_arguments((c.get("function") or {})
                                                                                   .get("arguments")), sort_keys=True))
        for c in message.get("tool_calls") or []
    )
    return message.get("role"), _text(message.get("content")).strip(), calls, message.get("tool_call_id")


@dataclass
class _Conversation:
    items: list[Any]  # messages (dicts) and Choices, in order
    keys: list[tuple]  # _key of each item, a Choice as its assistant message
    tools: list[dict[str, Any]] | None


def conversations(calls: list[ChatCall]) -> list[History]:
    """The recorded calls as conversations, in the order each began (see the module docstring)."""
    found: list[_Conversation] = []
    for call in calls:
        keys = [_key(m) for m in call.messages]
        # the longest conversation this call extends (the latest one wins a tie: the most recent turn)
        best = None
        for conv in found:
            n = len(conv.keys)
            if n <= len(keys) and keys[:n] == conv.keys and (best is None or n >= len(best.keys)):
                best = conv
        choice_key = _key(choice_to_message(call.choice))
        if best is None:
            found.append(_Conversation([*call.messages, call.choice], [*keys, choice_key], call.tools))
        else:
            n = len(best.keys)
            best.items.extend([*call.messages[n:], call.choice])
            best.keys.extend([*keys[n:], choice_key])
            best.tools = call.tools if call.tools else best.tools
    return [History(messages_and_choices=c.items, tools=c.tools) for c in found]


def call_from_bodies(request: dict[str, Any], response: dict[str, Any]) -> ChatCall:
    """A ChatCall from a chat completion's request and response JSON (the first choice: an agent
    continues with one)."""
    return ChatCall(messages=list(request.get("messages") or []), tools=request.get("tools") or None,
                    choice=Choice.model_validate(response["choices"][0]))
