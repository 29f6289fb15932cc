"""Math: the answer parser accepts and rejects the right strings; problems are seeded and correct."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from groupwise.envs.math import ScenarioMath, make_problem, parse_answer, rollout, validate


@pytest.mark.parametrize(
    "reply, expected",
    [
        # boxed: the last box decides
        (r"\boxed{42}", 42),
        (r"so \boxed{ -7 }.", -7),
        (r"\boxed{1,234}", 1234),
        (r"\boxed{\$5}", 5),
        (r"first \boxed{3} then \boxed{4}", 4),
        (r"\boxed{42.0}", 42),
        # "Answer:" markers
        ("Answer: 42", 42),
        ("answer is 5, because 2 + 3 = 5", 5),
        ("The answer = $1,500 dollars", 1500),
        ("Step 1: 3 + 4 = 7. Answer: 7.", 7),
        ("ANSWER: **12**", 12),
        # last number fallback (not strict)
        ("3 + 4 makes 7", 7),
        ("the numbers are 3, 4", 4),
        ("It is 12.5 metres", Fraction(25, 2)),
        # rejected
        ("", None),
        ("I don't know", None),
        (r"\boxed{}", None),
        (r"\boxed{x+1} so 5", None),           # a box that is not a number is not second-guessed
        ("Answer: forty-two", None),           # a marker not followed by a number
        ("Answer: 3/4", None),                 # fractions are not read as numbers
        ("it is 3/4", None),
    ],
)
def test_parse_answer(reply, expected):
    assert parse_answer(reply) == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("reply, expected", [
    ("\\boxed{" + " " * 1_000_000 + "x}", None), ("\\boxed{" + " " * 1_000_000 + "4 }", 4),
    ("Answer: *" + " " * 1_000_000 + "x", None), ("Answer: **" + "\n" * 1_000_000 + "12", 12),
])
def test_a_reply_of_long_whitespace_is_read_in_one_pass(reply, expected):
    # The box and marker patterns had two whitespace runs side by side (\s*\\?\$?\s*), which the regex
    # split every way before failing: a box of 4,000 spaces and an "x" took 0.55 s, 40,000 took a minute,
    # holding the GIL of the process whose rollouts and server this reward runs in. A small model
    # degenerating into whitespace writes such a reply (40,000 spaces are ~500 tokens).
    assert parse_answer(reply) == expected


def test_strict_mode_only_reads_boxes_and_markers():
    assert parse_answer("3 + 4 makes 7", strict=True) is None
    assert parse_answer("Answer: 7", strict=True) == 7
    assert parse_answer(r"\boxed{7}", strict=True) == 7


@pytest.mark.parametrize("level", [1, 2, 3])
def test_problems_are_seeded_and_answers_exact(level):
    for seed in range(200):
        p = make_problem(seed, level)
        assert p == make_problem(seed, level) and isinstance(p.answer, int)
        if p.kind == "arithmetic":  # recompute from the question text
            expr = re.fullmatch(r"What is (.+)\?", p.question).group(1).replace("/", "//")
            assert eval(expr) == p.answer  # noqa: S307 - our own generated digits and operators
        if level == 1:
            assert 0 <= p.answer <= 18
    assert len({make_problem(s, level).question for s in range(200)}) > 20
    with pytest.raises(ValueError, match="levels are 1, 2 and 3"):
        make_problem(0, 4)


async def test_rollout_grades_the_reply(scripted):
    problem = make_problem(5, 1)
    model = scripted([f"Let me think. Answer: {problem.answer}", "Answer: -1"])
    good = await rollout(model, ScenarioMath(seed=5))
    bad = await rollout(model, ScenarioMath(seed=5))
    assert (good.reward, validate(good), bad.reward, validate(bad)) == (1.0, 1.0, 0.0, 0.0)
    assert good.metadata["answer"] == str(problem.answer) and len(good.choices()) == 1
    assert model.requests[0]["messages"][1]["content"] == problem.question
    assert model.requests[0]["max_tokens"] == 48
