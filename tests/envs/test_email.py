"""Email search: the corpus is deterministic, every question's keywords find its source email, the
tools validate their arguments, answers are graded right, and the rollout drives the tools."""

from __future__ import annotations

import json

import pytest

from groupwise.envs.email_search import ScenarioEmail, email_reward, is_correct, rollout, scenarios, validate
from groupwise.envs.email_search import tools as T
from groupwise.envs.email_search.env import parse_text_tool_calls
from groupwise.envs.email_search.inbox import check_fts5, generate_corpus
from groupwise.envs.email_search.questions import questions_from_corpus, split_questions


@pytest.fixture(scope="module")
def questions():
    return questions_from_corpus(generate_corpus(0))


def test_corpus_is_deterministic_and_has_threads():
    check_fts5()
    a = generate_corpus.__wrapped__(0, n_inboxes=2, emails_per_inbox=300)
    b = generate_corpus.__wrapped__(0, n_inboxes=2, emails_per_inbox=300)
    assert a.emails == b.emails and a.facts == b.facts
    assert generate_corpus.__wrapped__(1, n_inboxes=2, emails_per_inbox=300).emails != a.emails
    c = generate_corpus(0)
    # 8 inboxes x 800 emails; 6 fact kinds x 5 facts per inbox = 30 questions per inbox
    assert len(c.inboxes) == 8 and len(c.emails) == 6400 and len(c.facts) == 240
    assert len({e.message_id for e in c.emails}) == 6400
    threads = {}
    for e in c.emails:
        threads.setdefault(e.thread_id, []).append(e)
    assert sum(len(t) > 1 for t in threads.values()) > 500
    ids = {e.message_id for e in c.emails}
    assert all(f.source_id in ids for f in c.facts)


def test_every_question_finds_its_source_with_its_keywords(db, questions):
    for q in questions:
        hits = T.search_emails(db, q.inbox, list(q.keywords))
        assert q.source_id in [h["message_id"] for h in hits], q
        # ...and the source email holds the answer
        assert q.answer in T.read_email(db, q.inbox, q.source_id)["body"]


def test_search_filters_and_errors(db, questions):
    q = questions[0]
    src = T.read_email(db, q.inbox, q.source_id)
    day = src["date"][:10]
    hits = T.search_emails(db, q.inbox, list(q.keywords), from_addr=src["from"].split("@")[0].upper(),
                           sent_after=day, max_results=3)
    assert q.source_id in [h["message_id"] for h in hits] and len(hits) <= 3
    assert all(h["from"] == src["from"] for h in hits)
    assert q.source_id not in [h["message_id"] for h in T.search_emails(db, q.inbox, list(q.keywords), sent_before=day)]
    assert T.search_emails(db, q.inbox, " ".join(q.keywords))  # a string of keywords is split
    assert T.search_emails(db, q.inbox, ['budget") OR ("x']) is not None  # FTS syntax stays inert
    other_inbox = next(x.inbox for x in questions if x.inbox != q.inbox)
    with pytest.raises(T.ToolError, match="no email with message_id"):
        T.read_email(db, other_inbox, q.source_id)  # the tools never cross inboxes
    for bad in ({"sent_after": "March 3"}, {"max_results": 50}, {"max_results": "many"}):
        with pytest.raises(T.ToolError):
            T.search_emails(db, q.inbox, ["budget"], **bad)
    with pytest.raises(T.ToolError, match="at least one keyword"):
        T.search_emails(db, q.inbox, [])


@pytest.mark.parametrize(
    "answer, truth, expected",
    [
        ("BAVN8W", "BAVN8W", True),
        ("bavn8w.", "BAVN8W", True),
        ("The code is BAVN8W", "BAVN8W", True),            # truth plus <= 3 extra words
        ("$291,000", "$291,000", True),
        ("291000", "$291,000", True),
        ("Room 4B", "4B", True),
        ("555-0142", "555-0142", True),
        ("The Copper Pot", "The Copper Pot", True),
        ("Copper Pot", "The Copper Pot", True),            # a leading article is dropped
        ("4C", "4B", False),
        ("$290,000", "$291,000", False),
        ("It is either 4A, 4B, 4C or 4D, I am not sure", "4B", False),  # too many extra words
        ("", "4B", False),
    ],
)
def test_is_correct(answer, truth, expected):
    assert is_correct(answer, truth) is expected


def test_reward_tiers_pinned():
    base = dict(correct=False, answered=True, idk=False, format_error=False, found_source=False,
                read_source=False, cited_source=False, turns=3, max_turns=6)
    # correct, cited, 3 of 6 turns used: 1 + 0.1 + 0.1 * (1 - 3/6) = 1.15
    assert email_reward(**{**base, "correct": True, "cited_source": True}) == pytest.approx(1.15)
    assert email_reward(**{**base, "found_source": True, "read_source": True}) == pytest.approx(-0.8)  # wrong + 0.2
    assert email_reward(**{**base, "idk": True, "found_source": True}) == pytest.approx(0.1)
    assert email_reward(**{**base, "answered": False}) == 0.0
    assert email_reward(**{**base, "answered": False, "format_error": True}) == -2.0


def test_split_80_10_10_fixed(questions):
    train, val, test = split_questions(questions)
    assert (len(train), len(val), len(test)) == (192, 24, 24)
    assert not {q.id for q in train} & {q.id for q in val + test}
    tr0, va0, _ = scenarios(0)
    tr1, va1, _ = scenarios(1)
    assert [s.question_id for s in va0] == [s.question_id for s in va1]
    assert sorted(s.question_id for s in tr0) == sorted(s.question_id for s in tr1)


@pytest.mark.parametrize(
    "reply, expected",
    [
        ('<tool_call>{"name": "read_email", "arguments": {"message_id": "m0-1"}}</tool_call>', ("read_email", {"message_id": "m0-1"}, None)),
        ('thinking... <tool_call>{"name": "search_emails", "arguments": {"keywords": ["a"]}}', ("search_emails", {"keywords": ["a"]}, None)),  # cut off
        ('{"name": "read_email", "arguments": "{\\"message_id\\": \\"m0-1\\"}"}', ("read_email", {"message_id": "m0-1"}, None)),
        ("<tool_call>{name: read_email}</tool_call>", ("?", None, "not valid JSON")),
        ('<tool_call>["read_email"]</tool_call>', ("?", None, "JSON object")),
        ("I will search the inbox now.", None),
    ],
)
def test_parse_text_tool_calls(reply, expected):
    calls = parse_text_tool_calls(reply)
    if expected is None:
        assert calls == []
        return
    (call,) = calls
    name, args, error = expected
    assert (call.name, call.arguments) == (name, args)
    assert (call.error is None) if error is None else (error in call.error)


def _scenario(q, db, **kw):
    return ScenarioEmail(question_id=q.id, inbox=q.inbox, question=q.question, answer=q.answer,
                         source_id=q.source_id, today=q.today, db=db, **kw)


def _tool_text(name, **args):
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


async def test_rollout_text_mode(scripted, db, questions):
    q = questions[3]
    model = scripted([
        _tool_text("search_emails", keywords=list(q.keywords)),
        _tool_text("read_email", message_id=q.source_id),
        _tool_text("return_final_answer", answer=q.answer, sources=[q.source_id]),
    ])
    traj = await rollout(model, _scenario(q, db, tool_mode="text"))
    assert traj.metrics["correct"] == 1.0 and validate(traj) == 1.0
    assert traj.reward == pytest.approx(1.125)  # correct, cited, 3 of 4 turns: 1 + 0.1 + 0.1 * 1/4
    assert traj.metrics["found_source"] == traj.metrics["read_source"] == 1.0
    assert traj.metadata["question_id"] == q.id and traj.tools is None
    roles = [m["role"] for m in traj.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert q.source_id in traj.messages()[3]["content"]  # the search result went back to the model
    assert "tools" not in model.requests[0] and "<tool_call>" in model.requests[0]["messages"][0]["content"]


async def test_rollout_native_mode(scripted, db, questions):
    q = questions[7]
    model = scripted([
        {"tool_calls": [("search_emails", {"keywords": list(q.keywords)})]},
        {"tool_calls": [("return_final_answer", {"answer": "no idea, sorry: I don't know", "sources": []})]},
    ])
    traj = await rollout(model, _scenario(q, db, tool_mode="native"))
    assert traj.metrics["idk"] == 1.0 and traj.metrics["correct"] == 0.0
    assert traj.reward == pytest.approx(0.1)  # I don't know (0) + found the source (0.1)
    assert traj.tools == T.TOOLS and model.requests[0]["tools"] == T.TOOLS
    assert model.requests[0]["tool_choice"] == "required"
    assert model.requests[1]["tool_choice"] == "required"  # turn 2 of 4 is not the last


async def test_native_last_turn_forces_the_final_answer(scripted, db, questions):
    q = questions[7]
    model = scripted([
        {"tool_calls": [("search_emails", {"keywords": list(q.keywords)})]},
        {"tool_calls": [("return_final_answer", {"answer": q.answer, "sources": []})]},
    ])
    traj = await rollout(model, _scenario(q, db, tool_mode="native", max_turns=2))
    assert model.requests[1]["tool_choice"] == {"type": "function", "function": {"name": "return_final_answer"}}
    # correct, not cited, 2 of 2 turns: 1 + 0 + 0.1 * 0
    assert traj.metrics["correct"] == 1.0 and traj.reward == pytest.approx(1.0)
    tool_msgs = [m for m in traj.messages() if m["role"] == "tool"]
    assert tool_msgs[0]["tool_call_id"] == "call_1_0"
    assert traj.messages()[2]["tool_calls"][0]["function"]["name"] == "search_emails"


async def test_rollout_format_and_tool_errors(scripted, db, questions):
    q = questions[0]
    model = scripted([_tool_text("delete_email", message_id="x"), "The answer is 4B."])
    traj = await rollout(model, _scenario(q, db, tool_mode="text"))
    assert traj.metrics["tool_errors"] == 1 and traj.metrics["format_error"] == 1.0
    assert traj.reward == -2.0 and "unknown tool" in traj.messages()[3]["content"]
    model = scripted(lambda body: _tool_text("search_emails", keywords=["nothing-matches-this"]))
    traj = await rollout(model, _scenario(q, db, max_turns=2, tool_mode="text"))
    assert traj.metrics["turns"] == 2 and traj.metrics["answered"] == 0.0 and traj.reward == 0.0
