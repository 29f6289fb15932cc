"""Titles: the title extractor, the fixed split, one scripted rollout (no reward from code)."""

from __future__ import annotations

import pytest

from groupwise.envs.titles import RUBRIC, ScenarioTitle, extract_title, rollout, scenarios, validate
from groupwise.envs.titles.texts import TEXTS


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Bread by Bicycle at Dawn", "Bread by Bicycle at Dawn"),
        ('Title: "Bread by Bike"', "Bread by Bike"),
        ("**Title:** The Oak That Got a Lightning Rod", "The Oak That Got a Lightning Rod"),
        ("\n\n# A Lynx Returns\nThis title works because...", "A Lynx Returns"),
        ("“Quiet Hour”", "Quiet Hour"),
        ("", ""),
    ],
)
def test_extract_title(reply, expected):
    assert extract_title(reply) == expected


def test_texts_and_split():
    assert len(TEXTS) == 60 and len(set(TEXTS)) == 60
    train, val, test = scenarios(0)
    assert (len(train), len(val), len(test)) == (48, 6, 6)
    ids = [s.text_id for s in train + val + test]
    assert sorted(ids) == list(range(60))
    assert [s.text_id for s in scenarios(1)[1]] == [s.text_id for s in val]
    assert "specific" in RUBRIC


async def test_rollout_records_the_title(scripted):
    model = scripted(['Title: "Two Hundred Fruit Trees on an Old Railway"'])
    text = TEXTS[6]
    traj = await rollout(model, ScenarioTitle(text_id=6, text=text))
    assert traj.metadata["title"] == "Two Hundred Fruit Trees on an Old Railway"
    assert traj.metrics["title_words"] == 8 and traj.metrics["empty_title"] == 0.0
    # two, hundred, fruit, trees, railway occur in the text; on, an, old do not: 5 / 8
    assert traj.metrics["copied_words"] == pytest.approx(5 / 8)
    assert traj.reward == 0.0 and validate(traj) is None
    assert model.requests[0]["messages"][1]["content"] == text
