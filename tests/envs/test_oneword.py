"""oneword: the reward grades a reply's form (1 / its words), the splits are fixed and
disjoint, and a rollout asks the question under the one-word instruction and grades what comes back."""

from __future__ import annotations

import pytest

from groupwise.envs.oneword import QUESTIONS, ScenarioOneWord, reward_of, rollout, scenarios, validate
from groupwise.envs.oneword.env import SYSTEM_PROMPT


@pytest.mark.parametrize("reply, expected", [
    ("Blue", 1.0), (" Blue.", 1.0), ("Paris!\n", 1.0), ("*Blue*", 1.0), ("don't", 1.0), ("42", 1.0),
    ("Blue sky", 0.5), ("The sky is blue.", 0.25), ("Blue, of course", 1 / 3), ("", 0.0), ("...", 0.0),
])
def test_the_reward_is_the_inverse_of_the_word_count(reply, expected):
    # punctuation and markup are not words: the format trained is the length, one word
    assert reward_of(reply) == pytest.approx(expected)
    assert reward_of(reply, "exact") == float(expected == 1.0)  # the sparse reward: one word or nothing


def test_the_splits_are_fixed_disjoint_and_cover_the_questions():
    train0, val0, test0 = scenarios(0)
    train1, val1, test1 = scenarios(1)
    ids = lambda ss: [s.question_id for s in ss]  # noqa: E731
    assert ids(val0) == ids(val1) and ids(test0) == ids(test1) and sorted(ids(train0)) == sorted(ids(train1))
    assert ids(train0) != ids(train1)  # each seed its own order
    assert sorted(ids(train0) + ids(val0) + ids(test0)) == list(range(len(QUESTIONS)))
    assert all(s.sampling_seed is not None for s in val0 + test0) and all(s.sampling_seed is None for s in train0)
    assert scenarios(0, max_tokens=8)[1][0].max_tokens == 8


async def test_a_rollout_asks_for_one_word_and_grades_the_reply(scripted):
    model = scripted(["Blue.", "The sky is blue."])
    good = await rollout(model, ScenarioOneWord(question_id=0))
    bad = await rollout(model, ScenarioOneWord(question_id=0))
    assert (good.reward, validate(good), bad.reward, validate(bad)) == (1.0, 1.0, 0.25, 0.0)
    assert (good.metrics["words"], bad.metrics["words"]) == (1.0, 4.0) and len(good.choices()) == 1
    sent = model.requests[0]
    assert sent["messages"] == [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": QUESTIONS[0]}]
    assert sent["max_tokens"] == 24
    # the sparse reward grades the same replies 1 or 0; the validation metric does not change with it
    model = scripted(["Blue.", "The sky is blue."])
    exact = [await rollout(model, ScenarioOneWord(question_id=0, reward="exact")) for _ in range(2)]
    assert [(t.reward, validate(t)) for t in exact] == [(1.0, 1.0), (0.0, 0.0)]
