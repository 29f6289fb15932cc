"""Titles: write an engaging title for a short text. Not verifiable: the reward is RULER's.

The rollout only asks for the title and records it; there is no reward from code (the trajectory keeps
reward 0.0 until the loop's judge scores the group with `RUBRIC`). `validate` returns None: there is no
ground truth, so progress is judged by the judge's reward and by side-by-side samples
(`groupwise compare`). The metrics (length in words, empty title, words copied from the text) are
there to spot gaming: a judge that likes long titles, or titles that just repeat the first sentence.
"""

from __future__ import annotations

import random
import re
from typing import Any

from pydantic import Field

from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory
from groupwise.envs.titles.texts import TEXTS
from groupwise.core.trajectory import Trajectory

SYSTEM_PROMPT = "Write one short, engaging title for the text the user gives you. Reply with the title only."

RUBRIC = """\
Score each title for the same text from 0 to 1. A great title:
- is accurate: it promises nothing the text does not say;
- is specific to this text (a detail, a number, a place), not a title that would fit any story;
- makes a reader want to read the text, by curiosity or a surprising detail, without clickbait
  ("You won't believe...") or ALL CAPS;
- is short: about 4 to 12 words, one line, no quotes around it, no "Title:" label, no explanation.
A reply that is not a title (an answer, a summary, several options, or empty) scores near 0.
Compare the titles with each other: give the best clearly more than the rest."""


class ScenarioTitle(Sampling):
    text_id: int = Field(description="Index into TEXTS.")
    text: str
    max_tokens: int = Field(24, gt=0, description="Most tokens of the reply; a title is ~10.")


def extract_title(reply: str) -> str:
    """The title in a reply: its first non-empty line, without a "Title:" label, quotes or markdown."""
    for line in (reply or "").splitlines():
        line = line.strip()
        if not line:
            continue
        line = re.sub(r"^(#+\s*|\*\*)?\s*title\s*:\s*", "", line, flags=re.IGNORECASE)
        return line.strip().strip("*#").strip().strip('"“”\'').strip()
    return ""


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


async def rollout(model: Any, scenario: ScenarioTitle) -> Trajectory:
    traj = new_trajectory(SYSTEM_PROMPT, scenario.text)
    traj.metadata.update({"env": "titles", "text_id": scenario.text_id})
    choice = await complete(model, traj.messages(), scenario)
    traj.messages_and_choices.append(choice)
    title = extract_title(choice_text(choice))
    words = _words(title)
    text_words = set(_words(scenario.text))
    traj.metadata["title"] = title
    traj.metrics.update({
        "title_words": len(words),
        "empty_title": float(not words),
        # fraction of the title's words that occur in the text: near 1 means the title copies the text
        "copied_words": (sum(w in text_words for w in words) / len(words)) if words else 0.0,
        "truncated": float(choice.finish_reason == "length"),
    })
    return traj.finish()


def validate(trajectory: Trajectory) -> None:
    """No verifiable metric: titles are judged (RULER reward, side-by-side samples)."""
    return None


def scenarios(seed: int = 0, **overrides: Any):
    """(train, val, test) = 48 / 6 / 6 texts, the same split for every run seed; train order shuffled."""
    order = list(range(len(TEXTS)))
    random.Random("titles-split").shuffle(order)
    train_ids, val_ids, test_ids = order[:48], order[48:54], order[54:]
    random.Random(f"titles-train:{seed}").shuffle(train_ids)
    make = lambda i, **kw: ScenarioTitle(text_id=i, text=TEXTS[i], **{**kw, **overrides})  # noqa: E731
    return (
        [make(i) for i in train_ids],
        [make(i, sampling_seed=i) for i in val_ids],
        [make(i, sampling_seed=i) for i in test_ids],
    )
