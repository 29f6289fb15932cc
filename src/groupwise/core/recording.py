"""Recorded chat completions, and the conversations they make: what a rollout's model calls become
when they are captured below the agent's code (LangChain's chat model, `capture_auto_trajectory`).

Calls become conversations: a call whose messages start with an earlier conversation (its messages
and the assistant turn it sampled) continues it; any other call starts a new one (a sub-agent, a
router, a summariser). Messages are compared by what the model saw (role, text, tool calls with their
arguments parsed, tool_call_id), not by their JSON: a framework that sends a turn back re-serialises it
(spacing in the arguments, ``refusal: null`` and other fields the SDK adds), and that must not split one
conversation into two. A text completion (``/v1/completions``: no messages) continues another when its
prompt's token ids start with that one's prompt and sampled ids.

A history that branches is ambiguous: a call that sends back a turn the model sampled and then goes on
differently from the conversation that turn belongs to (a retry from an earlier turn, a tree search)
makes two conversations that share sampled turns, and which one the trajectory's reward judges is not
the data's to say. `conversations(calls, branches=...)` says what to do: "refuse" raises
`AmbiguousHistoryError` naming the call, "split" keeps each branch as its own conversation (the shared
turns then train once per branch), "last" keeps only the latest branch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from groupwise.core.choices import choice_to_message, choice_token_ids
from groupwise.core.trajectory import Choice, History
from groupwise.errors import AmbiguousHistoryError, GroupwiseError

__all__ = ["BRANCHES", "Branches", "ChatCall", "call_from_bodies", "conversations"]

Branches = Literal["refuse", "split", "last"]
BRANCHES: tuple[str, ...] = ("refuse", "split", "last")


@dataclass(frozen=True)
class ChatCall:
    """One model call: the messages and tools it was asked with (a chat request's, or the chat form of a
    Responses / Messages request), the choice it returned, the model it asked for, and for a text
    completion the token ids of its prompt (it has no messages the trainer could render)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    choice: Choice
    model: str | None = None
    prompt_ids: list[int] | None = None


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
    keys: list[tuple]  # _key of each item, a Choice as its assistant message; a completion: its token ids
    tools: list[dict[str, Any]] | None
    first_choice: int  # the index in `keys` of its first sampled turn (a completion: its first sampled id)
    start: int  # the number of the call that began it


def _common(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _call_keys(call: ChatCall) -> tuple[list[Any], list[Any]]:
    """(keys of what the call was asked with, keys of what it sampled): messages, or token ids."""
    if call.prompt_ids is not None:
        return list(call.prompt_ids), list(choice_token_ids(call.choice) or [])
    return [_key(m) for m in call.messages], [_key(choice_to_message(call.choice))]


def conversations(calls: list[ChatCall], *, branches: Branches = "split") -> list[History]:
    """The recorded calls as conversations, in the order each began (see the module docstring)."""
    if branches not in BRANCHES:
        raise GroupwiseError(f"branches={branches!r}: use one of {list(BRANCHES)}")
    found: list[_Conversation] = []
    for number, call in enumerate(calls):
        keys, sampled = _call_keys(call)
        raw = call.prompt_ids is not None
        mine = [c for c in found if _is_raw(c) == raw]
        # the longest conversation this call extends (the latest one wins a tie: the most recent turn)
        best = None
        for conv in mine:
            n = len(conv.keys)
            if n <= len(keys) and keys[:n] == conv.keys and (best is None or n >= len(best.keys)):
                best = conv
        if best is not None:
            n = len(best.keys)
            best.items.extend([*_new_items(call, n), call.choice])
            best.keys.extend([*keys[n:], *sampled])
            best.tools = call.tools if call.tools else best.tools
            continue
        # a call that sends back a sampled turn of a conversation but does not continue it: a branch
        parent = max(mine, key=lambda c: _common(c.keys, keys), default=None)
        shared = _common(parent.keys, keys) if parent is not None else 0
        if parent is not None and shared > parent.first_choice:
            if branches == "refuse":
                raise AmbiguousHistoryError(
                    f"call {number + 1} (model {call.model!r}) branches off the conversation that call "
                    f"{parent.start + 1} began: it sends back that conversation's first {shared} "
                    f"{'tokens' if raw else 'messages'}, sampled turns included, then goes on differently, so "
                    "two histories share those sampled turns. Say which to train: "
                    "capture_auto_trajectory(..., branches='last') keeps the latest branch, branches='split' "
                    "keeps each branch as its own history (the shared turns train once per branch)")
            items = _shared_items(parent, shared, raw)
            conv = _Conversation([*items, *_new_items(call, shared), call.choice], [*keys, *sampled], call.tools,
                                 parent.first_choice, number)
            if branches == "last":
                found[found.index(parent)] = conv
            else:
                found.append(conv)
            continue
        found.append(_Conversation([*_new_items(call, 0), call.choice], [*keys, *sampled], call.tools, len(keys),
                                   number))
    return [History(messages_and_choices=c.items, tools=c.tools) for c in found]


def _is_raw(conv: _Conversation) -> bool:
    return bool(conv.keys) and not isinstance(conv.keys[0], tuple)


def _new_items(call: ChatCall, n: int) -> list[Any]:
    """The items of `call` past the first `n` keys a conversation already holds: its messages past the n-th;
    a completion's prompt text only when it begins a conversation (its continuation is in its ids)."""
    if call.prompt_ids is not None:
        return list(call.messages) if n == 0 else []
    return list(call.messages[n:])


def _shared_items(parent: _Conversation, shared: int, raw: bool) -> list[Any]:
    """The items of `parent` whose keys a branch shares (its sampled Choices, not the echoes sent back)."""
    if raw:  # a completion's items: the prompt message, then one Choice per call
        out, at = [], 0
        for item in parent.items:
            if isinstance(item, Choice):
                prompt = item.model_extra.get("prompt_token_ids") if item.model_extra else None
                at = len(prompt or []) + len(choice_token_ids(item) or [])
                if at > shared:
                    break
            out.append(item)
        return out
    return list(parent.items[:shared])


def call_from_bodies(request: dict[str, Any], response: dict[str, Any]) -> ChatCall:
    """A ChatCall from a chat completion's request and response JSON (the first choice: an agent
    continues with one)."""
    return ChatCall(messages=list(request.get("messages") or []), tools=request.get("tools") or None,
                    choice=Choice.model_validate(response["choices"][0]),
                    model=request.get("model") if isinstance(request.get("model"), str) else None)
