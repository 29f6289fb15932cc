"""The email tools answer every bad argument a model's JSON can carry with a ToolError (which the
rollout shows the model), never an uncaught exception: Infinity, -Infinity, NaN, 1e400, huge ints."""

from __future__ import annotations

import json

import pytest

from groupwise.envs.email_search import ScenarioEmail, rollout
from groupwise.envs.email_search import tools as T
from groupwise.envs.email_search.inbox import generate_corpus
from groupwise.envs.email_search.questions import questions_from_corpus


@pytest.fixture(scope="module")
def question():
    return questions_from_corpus(generate_corpus(0))[0]


@pytest.mark.parametrize("raw", ["Infinity", "-Infinity", "NaN", "1e400", "10000000000000000000000"])
def test_max_results_from_json_is_a_tool_error(db, question, raw):
    value = json.loads(raw)  # what json.loads makes of a model's tool-call arguments
    with pytest.raises(T.ToolError, match="max_results"):
        T.search_emails(db, question.inbox, ["budget"], max_results=value)


async def test_a_rollout_with_infinity_in_a_tool_call_goes_on(scripted, db, question):
    model = scripted([
        '<tool_call>{"name": "search_emails", "arguments": {"keywords": ["budget"], "max_results": Infinity}}</tool_call>',
        "The answer is 4B.",
    ])
    scenario = ScenarioEmail(question_id=question.id, inbox=question.inbox, question=question.question,
                             answer=question.answer, source_id=question.source_id, today=question.today, db=db,
                             tool_mode="text")
    traj = await rollout(model, scenario)
    assert traj.metrics["tool_errors"] == 1
    assert "max_results must be an integer between 1 and" in traj.messages()[3]["content"]


# A model's JSON can carry a lone surrogate ("\ud800" parses to one) and can nest without bound; both
# used to escape the tools as UnicodeEncodeError (SQLite) and RecursionError (json), failing the rollout,
# and a stored answer holding a surrogate failed the whole step's write (the step was neither saved nor
# trained).

@pytest.mark.parametrize("day", ["2024-01-01\n", "\u0662\u0660\u0662\u0664-01-01"])
def test_a_day_with_a_trailing_newline_or_other_digits_is_a_tool_error(db, question, day):
    # "YYYY-MM-DD\n" passed the check (Python's `$` matches before a final newline) and "٢٠٢٤-01-01"
    # did too (\d is any digit); SQLite then compared the text to the stored dates as it came
    assert T.search_emails(db, question.inbox, ["budget"], sent_after="2000-01-01") != []
    with pytest.raises(T.ToolError, match="sent_after must be a day as YYYY-MM-DD"):
        T.search_emails(db, question.inbox, ["budget"], sent_after=day)


@pytest.mark.parametrize("field", ["from_addr", "to_addr"])
def test_a_lone_surrogate_in_a_filter_matches_nothing(db, question, field):
    assert T.search_emails(db, question.inbox, ["budget"]) != []
    assert T.search_emails(db, question.inbox, ["budget"], **{field: "\ud800"}) == []


def test_a_lone_surrogate_message_id_is_a_tool_error(db, question):
    with pytest.raises(T.ToolError, match=r"no email with message_id '\\ud800'"):
        T.read_email(db, question.inbox, "\ud800")


def test_a_tool_call_nested_3000_deep_is_a_format_error():
    from groupwise.envs.email_search.env import parse_text_tool_calls

    deep = "[" * 3000 + "]" * 3000
    [call] = parse_text_tool_calls('<tool_call>{"name": "search_emails", "arguments": {"keywords": ' + deep + "}}</tool_call>")
    assert call.arguments is None and "nested deeper than 32 levels" in call.error
    # inside a string the brackets are text, not nesting
    [call] = parse_text_tool_calls('<tool_call>{"name": "search_emails", "arguments": {"keywords": ["' + deep + '"]}}</tool_call>')
    assert call.error is None and call.arguments == {"keywords": [deep]}


async def test_a_rollout_with_surrogates_and_deep_nesting_finishes_and_is_stored(scripted, db, question, tmp_path):
    from groupwise import TrajectoryGroup
    from groupwise.runs.store import RunStore

    model = scripted([
        '<tool_call>{"name": "search_emails", "arguments": {"keywords": ["budget"], "from_addr": "\\ud800"}}</tool_call>',
        '<tool_call>{"name": "read_email", "arguments": {"message_id": "\\udfff", "\\udc00": 1}}</tool_call>',
        '<tool_call>{"name": "read_email", "arguments": {"message_id": ' + "[" * 3000 + "]" * 3000 + "}}</tool_call>",
        '<tool_call>{"name": "return_final_answer", "arguments": {"answer": "\\ud800", "sources": ["\\udbff"]}}</tool_call>',
    ])
    scenario = ScenarioEmail(question_id=question.id, inbox=question.inbox, question=question.question,
                             answer=question.answer, source_id=question.source_id, today=question.today, db=db,
                             tool_mode="text")
    traj = await rollout(model, scenario)
    assert traj.metrics["answered"] == 1.0 and traj.metadata["answer"] == "\ud800"
    assert traj.metrics["tool_errors"] == 2  # the unknown argument, the nesting; the filter just matched nothing
    assert json.loads(traj.messages()[3]["content"].removeprefix("<tool_result>").removesuffix("</tool_result>")) == []
    # every request went out: the tool results quote the model's arguments as escapes
    assert len(model.requests) == 4 and "\\udc00" in traj.messages()[5]["content"]
    group = TrajectoryGroup([traj], exceptions=[ValueError("the model said \ud800")])
    store = RunStore(tmp_path, "email", "agent")
    store.write_trajectories("train", 0, [group])
    assert store.load_trajectories("train", 0) == [group]  # lone surrogates come back as they were
