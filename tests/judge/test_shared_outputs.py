"""Shared outputs: long contents repeated across a group are written once and referenced by id.

What must hold: the shared section appears once; each distinct long output appears exactly once in
the request; every reference resolves to the content the trajectory really saw (expanding the
references gives back the full rendering); short outputs stay inline; the prompt is byte-stable.
"""

from __future__ import annotations

import json
import re

from judge_helpers import shown_trajectories

import groupwise as gw
from groupwise.judge import ruler_score_group
from groupwise.judge.prompt import normalise_call_ids, shared_contents, split_prefix, user_message

TASK = [
    {"role": "system", "content": "You answer questions about an inbox."},
    {"role": "user", "content": "Which restaurant is booked for the team dinner?"},
]
SEARCH = json.dumps([{"message_id": f"m1-00{i}", "subject": f"Team dinner {i}", "snippet": "I booked a table " * 4}
                     for i in range(3)])  # ~250 characters: long
EMAIL = json.dumps({"message_id": "m1-001", "body": "I booked Maple & Rye for the team dinner on Tuesday. " * 5})
OTHER = json.dumps([{"message_id": "m1-009", "subject": "Weekly update", "snippet": "nothing about food " * 8}])
SHORT = "[]"


def turn(call_id: str, name: str, args: dict, result: str) -> list[dict]:
    return [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
        {"role": "tool", "tool_call_id": call_id, "content": result},
    ]


def rollouts() -> list[list[dict]]:
    """Four rollouts of one question: the same search twice, the same email read three times."""
    a = [*TASK, *turn("call_8f3a1", "search", {"q": "dinner"}, SEARCH), *turn("call_77b2", "read", {"id": "m1-001"}, EMAIL),
         {"role": "assistant", "content": "Maple & Rye, quality=0.9"}]
    b = [*TASK, *turn("call_x1", "search", {"q": "restaurant"}, SHORT), *turn("call_x2", "search", {"q": "dinner"}, SEARCH),
         *turn("call_x3", "read", {"id": "m1-001"}, EMAIL), {"role": "assistant", "content": "Maple & Rye, quality=0.7"}]
    c = [*TASK, *turn("call_q", "search", {"q": "weekly"}, OTHER), {"role": "assistant", "content": "I don't know, quality=0.3"}]
    d = [*TASK, *turn("call_z", "read", {"id": "m1-001"}, EMAIL), {"role": "assistant", "content": "Blue Fig, quality=0.1"}]
    return [a, b, c, d]


def expand(text: str) -> str:
    """The request with every `-> Tk` replaced by Tk's content and the shared section removed."""
    m = re.search(r"<shared_outputs>\n.*?\n(.*?)\n</shared_outputs>\n\n", text, re.DOTALL)
    assert m, "no shared section"
    table = dict(re.findall(r"^\[(T\d+)\] (.*)$", m.group(1), re.MULTILINE))
    body = text[: m.start()] + text[m.end():]
    return re.sub(r"\] -> (T\d+)$", lambda r: "] " + table[r.group(1)], body, flags=re.MULTILINE)


def render(lists, **kw) -> str:
    context, tools, items = split_prefix(lists)
    return user_message(context, tools, [(str(i + 1), it) for i, it in enumerate(items)], **kw)["content"]


def test_each_long_output_once_references_resolve_short_inline():
    lists = rollouts()
    full = render(lists)
    shared = render(lists, share_outputs=True)
    assert full.count(SEARCH) == 2 and full.count(EMAIL) == 3
    assert shared.count("<shared_outputs>") == 1
    assert shared.count(SEARCH) == 1 and shared.count(EMAIL) == 1  # each distinct long output once
    assert shared.count(OTHER) == 1 and "] -> T3" not in shared  # long but seen once: inline, no id
    assert shared.count("] []") == 1  # short output stays inline
    assert shared.count("] -> T1\n") == 2 and shared.count("] -> T2\n") == 3
    assert expand(shared) == full  # lossless: every reference resolves to what that trajectory saw


def test_threshold_and_continuations_decide_what_is_shared():
    lists = rollouts()
    assert "<shared_outputs>" not in render(lists, share_outputs=True, share_min_chars=10_000)
    # rollout b repeats nothing of a's first turns, so continuations change nothing here; make d start like a
    lists[3] = [*lists[0][:4], {"role": "assistant", "content": "Blue Fig, quality=0.1"}]
    text = render(lists, share_outputs=True, share_continuations=True)
    assert "first 2 message(s) after the context are identical to trajectory 1's" in text
    assert text.count(SEARCH) == 1 and text.count(EMAIL) == 1
    # counted over what is shown: a's search is shown once more in b only, so it is still shared
    assert text.count("] -> T1\n") == 2 and text.count("] -> T2\n") == 2


def test_call_ids_normalised_bijectively():
    ms = rollouts()[1]
    out = normalise_call_ids(ms)
    assert [m["tool_calls"][0]["id"] for m in out if m.get("tool_calls")] == ["c1", "c2", "c3"]
    assert [m["tool_call_id"] for m in out if m.get("tool_call_id")] == ["c1", "c2", "c3"]
    assert ms[2]["tool_calls"][0]["id"] == "call_x1"  # the input is not modified
    # the same turns made by two rollouts (the server gave them other random ids) now compare equal,
    # so the common prefix, duplicate detection and shared continuations see them
    again = [*TASK, *turn("call_0000", "search", {"q": "dinner"}, SEARCH), *turn("call_1111", "read", {"id": "m1-001"}, EMAIL)]
    assert rollouts()[0][:6] != again and normalise_call_ids(rollouts()[0])[:6] == normalise_call_ids(again)
    context, _, _ = split_prefix([rollouts()[0], again])
    assert len(context) == 6


def test_shared_contents_numbered_by_first_appearance():
    lists = [[{"role": "tool", "content": "B" * 5}, {"role": "tool", "content": "A" * 5}], [{"role": "tool", "content": "A" * 5},
             {"role": "tool", "content": "B" * 5}, {"role": "tool", "content": "C" * 5}]]
    assert shared_contents(lists, 5) == {"B" * 5: "T1", "A" * 5: "T2"}
    assert shared_contents(lists, 6) == {}


PINNED = """\
<context>
[system] You answer questions about an inbox.
[user] Which restaurant is booked for the team dinner?
</context>

<shared_outputs>
Long contents that occur more than once in the trajectories below, each written once here. \
A message shown as "[tool result c2] -> T1" had exactly the content of T1.
[T1] rows: m1-001 Team dinner, m1-002 Lunch
</shared_outputs>

<trajectory id="1">
[assistant calls search c1] {"q": "dinner"}
[tool result c1] -> T1
[assistant] Maple & Rye
</trajectory>

<trajectory id="2">
[assistant calls search c1] {"q": "team"}
[tool result c1] []
[assistant calls search c2] {"q": "dinner"}
[tool result c2] -> T1
[assistant] I don't know
</trajectory>

Score every trajectory: ids "1", "2". Answer with the JSON object only."""


def test_pinned_prompt_of_a_small_group():
    rows = "rows: m1-001 Team dinner, m1-002 Lunch"
    a = [*TASK, *turn("call_a", "search", {"q": "dinner"}, rows), {"role": "assistant", "content": "Maple & Rye"}]
    b = [*TASK, *turn("call_b", "search", {"q": "team"}, "[]"), *turn("call_c", "search", {"q": "dinner"}, rows),
         {"role": "assistant", "content": "I don't know"}]
    text = render([a, b], share_outputs=True, share_min_chars=20)
    assert text == PINNED
    assert render([a, b], share_outputs=True, share_min_chars=20) == text  # byte-stable


async def test_ruler_sends_shared_outputs_by_default_and_maps_scores(judge_server):
    group = gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=ms) for ms in rollouts()])
    url = {"base_url": judge_server.url, "api_key": "test", "backoff_s": 0.0}
    judged = await ruler_score_group(group, "scripted", **url)
    user = judge_server.requests[0]["messages"][1]["content"]
    assert user.count("<shared_outputs>") == 1 and user.count(SEARCH) == 1 and user.count(EMAIL) == 1
    assert "call_8f3a1" not in user and "[tool result c1]" in user  # the providers' random ids are not sent
    assert len(shown_trajectories(judge_server.requests[0])) == 4
    assert judged.rewards() == [0.9, 0.7, 0.3, 0.1]
    await ruler_score_group(group, "scripted", share_outputs=False, **url)
    user = judge_server.requests[1]["messages"][1]["content"]
    assert "<shared_outputs>" not in user and user.count(EMAIL) == 3
    assert expand(judge_server.requests[0]["messages"][1]["content"]).count(EMAIL) == 3


def test_lossless_on_a_group_from_the_real_email_env():
    """Three rollouts of one real question, tool results from the real tools: each distinct long
    result written once, and expanding the references gives back the full request."""
    from groupwise.envs.email_search import tools as T
    from groupwise.envs.email_search.inbox import default_database, generate_corpus
    from groupwise.envs.email_search.questions import questions_from_corpus

    db = str(default_database(0))
    q = questions_from_corpus(generate_corpus(0))[0]
    task = [{"role": "system", "content": f"You are an email assistant for {q.inbox}."}, {"role": "user", "content": q.question}]
    hits = json.dumps(T.search_emails(db, q.inbox, list(q.keywords)), ensure_ascii=False)
    wide = json.dumps(T.search_emails(db, q.inbox, [q.keywords[0]]), ensure_ascii=False)
    source = json.dumps(T.read_email(db, q.inbox, q.source_id), ensure_ascii=False)
    assert min(len(hits), len(wide), len(source)) >= 200 and len({hits, wide, source}) == 3
    lists = [
        [*task, *turn("call_a1", "search_emails", {"keywords": list(q.keywords)}, hits),
         *turn("call_a2", "read_email", {"message_id": q.source_id}, source), {"role": "assistant", "content": q.answer}],
        [*task, *turn("call_b1", "search_emails", {"keywords": [q.keywords[0]]}, wide),
         *turn("call_b2", "search_emails", {"keywords": list(q.keywords)}, hits),
         *turn("call_b3", "read_email", {"message_id": q.source_id}, source), {"role": "assistant", "content": q.answer}],
        [*task, *turn("call_c1", "search_emails", {"keywords": [q.keywords[0]]}, wide), {"role": "assistant", "content": "I don't know"}],
    ]
    full, shared = render(lists), render(lists, share_outputs=True)
    assert (full.count(hits), full.count(wide), full.count(source)) == (2, 2, 2)
    assert (shared.count(hits), shared.count(wide), shared.count(source)) == (1, 1, 1)
    assert expand(shared) == full and len(shared) < len(full) - len(hits) - len(wide) - len(source) + 400
