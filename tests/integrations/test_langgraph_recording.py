"""How recorded chat completions become a trajectory (groupwise.langgraph.recording), on hand-built calls:
the seam between the HTTP recording and the Trajectory, isolated from LangChain and the server."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("langchain_openai")

from groupwise.errors import GroupwiseError  # noqa: E402
from groupwise.langgraph.recording import fill_trajectory  # noqa: E402
from groupwise.core.recording import ChatCall, call_from_bodies, conversations  # noqa: E402
from groupwise.core.trajectory import Choice, Trajectory  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def choice(content=None, tool_call=None, token_ids=(1, 2)) -> Choice:
    message = {"role": "assistant", "content": content}
    if tool_call:
        call_id, name, arguments = tool_call
        message["tool_calls"] = [{"id": call_id, "type": "function",
                                  "function": {"name": name, "arguments": arguments}}]
    return Choice.model_validate({"index": 0, "finish_reason": "stop", "message": message,
                                  "token_ids": list(token_ids), "logprobs": None})


SYSTEM = {"role": "system", "content": "be brief"}
USER = {"role": "user", "content": "population of rome?"}


def test_a_react_loop_is_one_conversation_and_a_side_call_a_history():
    first = choice(tool_call=("call_1", "lookup", '{"city":"rome"}'), token_ids=(5, 6, 7))
    # LangChain sends the call back with its arguments re-serialised (spacing) and content None
    sent_back = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "rome"}'}}]}
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "2.8 million"}
    side = ChatCall([{"role": "user", "content": "summarise: 2.8 million"}], None, choice("2.8M"))
    final = choice("About 2.8 million.", token_ids=(8, 9))
    calls = [ChatCall([SYSTEM, USER], TOOLS, first), side, ChatCall([SYSTEM, USER, sent_back, tool], TOOLS, final)]
    main, other = conversations(calls)
    assert main.messages_and_choices == [SYSTEM, USER, first, tool, final]  # the sampled Choices, not echoes
    assert main.tools == TOOLS
    assert other.messages_and_choices == [*side.messages, side.choice] and other.tools is None


def test_a_call_that_rewrites_history_starts_a_new_conversation():
    a = choice("one")
    # the agent trimmed the system prompt: not a continuation, kept whole as its own conversation
    calls = [ChatCall([SYSTEM, USER], None, a), ChatCall([USER, {"role": "assistant", "content": "one"}], None, choice("two"))]
    assert [len(c.messages_and_choices) for c in conversations(calls)] == [3, 3]


def test_a_continuation_must_match_the_sampled_turn():
    a = choice(tool_call=("call_1", "lookup", '{"city": "rome"}'))
    edited = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "oslo"}'}}]}
    calls = [ChatCall([USER], TOOLS, a), ChatCall([USER, edited], TOOLS, choice("x"))]
    assert len(conversations(calls)) == 2  # different arguments: not the turn the model sampled


def test_fill_trajectory_keeps_the_rollouts_fields_and_histories():
    t = Trajectory(reward=0.5, metrics={"x": 1.0}, additional_histories=[])
    out = fill_trajectory(t, [call_from_bodies({"messages": [USER], "tools": TOOLS},
                                               {"choices": [json.loads(choice("hi").model_dump_json())]})])
    assert out is t and t.reward == 0.5 and t.metrics == {"x": 1.0}
    assert t.messages_and_choices[0] == USER and t.choices()[0].model_extra["token_ids"] == [1, 2]
    assert t.tools == TOOLS
    untouched = Trajectory(messages_and_choices=[USER], reward=1.0)
    assert fill_trajectory(untouched, []).messages_and_choices == [USER]  # no calls: nothing replaced
    with pytest.raises(GroupwiseError, match="must return a groupwise Trajectory"):
        fill_trajectory({"reward": 1.0}, [])
