"""The email tools answer every bad argument a model's JSON can carry with a ToolError (which the
rollout shows the model), never an uncaught exception: Infinity, -Infinity, NaN, 1e400, huge ints."""

from __future__ import annotations

import json

import pytest

from groupwise.envs.email_search import ScenarioEmail, rollout
from groupwise.envs.email_search import tools as T
from groupwise.envs.email_search.inbox import build_database, generate_corpus
from groupwise.envs.email_search.questions import questions_from_corpus


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return str(build_database(tmp_path_factory.mktemp("email") / "inbox.sqlite", generate_corpus(0)))


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
