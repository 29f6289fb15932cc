"""Recorded calls as conversations (groupwise.core.recording), as properties over generated agents: a
conversation that only ever continues is one history whatever its length; an agent that goes back to
any earlier sampled turn and continues differently is refused by default, split into one history per
branch (the shared Choices the same objects) or cut to its latest branch, as the caller says; the same
for text completions continued by token ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from groupwise.core.recording import ChatCall, conversations
from groupwise.core.trajectory import Choice
from groupwise.errors import AmbiguousHistoryError


def choice(text: str, ids: list[int], prompt: list[int] | None = None) -> Choice:
    extra = {"prompt_token_ids": prompt} if prompt is not None else {}
    return Choice.model_validate({"index": 0, "finish_reason": "stop", "logprobs": None, "token_ids": ids,
                                  "message": {"role": "assistant", "content": text}, **extra})


def chat_agent(turns: int) -> tuple[list[ChatCall], list[dict]]:
    """`turns` calls, each sending back every earlier turn (the sampled ones as plain messages)."""
    messages: list[dict] = [{"role": "user", "content": "q0"}]
    calls = []
    for k in range(turns):
        c = choice(f"a{k}", [k + 1])
        calls.append(ChatCall(list(messages), None, c, model="agent"))
        messages += [{"role": "assistant", "content": f" a{k} "}, {"role": "user", "content": f"q{k + 1}"}]
    return calls, messages


@settings(max_examples=30, deadline=None)
@given(turns=st.integers(1, 6), branches=st.sampled_from(["refuse", "split", "last"]))
def test_a_conversation_that_only_continues_is_one_history(turns, branches):
    calls, _ = chat_agent(turns)
    (history,) = conversations(calls, branches=branches)
    assert [c for c in history.messages_and_choices if isinstance(c, Choice)] == [c.choice for c in calls]


@settings(max_examples=40, deadline=None)
@given(turns=st.integers(2, 6), data=st.data())
def test_going_back_to_an_earlier_sampled_turn_is_a_branch(turns, data):
    calls, messages = chat_agent(turns)
    back = data.draw(st.integers(1, turns - 1))  # continue after sampled turn `back` (1-based) once more
    sent = messages[:2 * back] + [{"role": "user", "content": "something else"}]
    branch = ChatCall(sent, None, choice("b", [99]), model="agent")
    with pytest.raises(AmbiguousHistoryError, match=f"call {turns + 1} .* branches off"):
        conversations([*calls, branch], branches="refuse")
    main, other = conversations([*calls, branch], branches="split")
    assert [c for c in main.messages_and_choices if isinstance(c, Choice)] == [c.choice for c in calls]
    shared = [c for c in other.messages_and_choices if isinstance(c, Choice)]
    assert shared[:-1] == [c.choice for c in calls[:back]] and shared[-1] is branch.choice
    assert all(a is b for a, b in zip(shared[:-1], main.messages_and_choices[1::2]))  # the sampled objects, kept
    (last,) = conversations([*calls, branch], branches="last")
    assert last.messages_and_choices == other.messages_and_choices


@settings(max_examples=30, deadline=None)
@given(prompt=st.lists(st.integers(0, 999), min_size=1, max_size=5), sampled=st.lists(
    st.lists(st.integers(0, 999), min_size=1, max_size=4), min_size=2, max_size=4), data=st.data())
def test_text_completions_continue_and_branch_by_token_ids(prompt, sampled, data):
    calls, ids = [], list(prompt)
    for k, new in enumerate(sampled):
        calls.append(ChatCall([{"role": "user", "content": "p"}], None, choice("t", new, list(ids)), prompt_ids=list(ids)))
        ids += new + [1000 + k]  # the agent's own text after each completion
    (one,) = conversations(calls, branches="refuse")
    assert [c for c in one.messages_and_choices if isinstance(c, Choice)] == [c.choice for c in calls]
    # a prompt that takes the first completion's tokens and then goes on differently from the second call
    cut = len(prompt) + len(sampled[0])
    other = list(calls[1].prompt_ids[:cut]) + [5000]
    branch = ChatCall([{"role": "user", "content": "p"}], None, choice("x", [7], other), prompt_ids=other)
    with pytest.raises(AmbiguousHistoryError, match="tokens"):
        conversations([*calls, branch], branches="refuse")
    assert len(conversations([*calls, branch], branches="split")) == 2
