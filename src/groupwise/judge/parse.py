"""Strict parsing and validation of the judge's answer.

An answer is accepted only if it is one JSON object ``{"scores": [...]}`` whose entries name every
shown id exactly once, each with a finite score in [0, 1] and a string explanation. Anything else
raises `BadAnswer` listing every problem found (the retry / repair request shows them to the judge).

Tolerated, because they are unambiguous: surrounding whitespace, one Markdown code fence around the
object, a leading ``<think>...</think>`` block of reasoning models, integer ids (1 for "1").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass


class BadAnswer(ValueError):
    """The judge answered, but not with a valid score object. `raw` is its text."""

    def __init__(self, problems: list[str], raw: str | None):
        self.problems = problems
        self.raw = raw
        super().__init__("; ".join(problems))


@dataclass
class Score:
    score: float
    explanation: str


_FENCE = "```"
_LANGUAGE = re.compile(r"[a-zA-Z]*")


def _strip(text: str) -> str:
    """The answer without a leading ``<think>`` block and one Markdown fence around it. With str
    methods, not a regex: ``^```[a-zA-Z]*\\s*\\n?(.*?)\\n?```$`` backtracked over every pair of positions
    of an unclosed fence followed by whitespace (10 s for 20,000 newlines)."""
    text = text.strip()
    if text.startswith("<think>") and (end := text.find("</think>")) != -1:
        text = text[end + len("</think>"):].strip()
    if len(text) >= 2 * len(_FENCE) and text.startswith(_FENCE) and text.endswith(_FENCE):
        inner = text[len(_FENCE):-len(_FENCE)]
        return inner[_LANGUAGE.match(inner).end():].strip()
    return text


# An explanation is kept in every judged trajectory's logs (and so in the run store): the prompt asks
# for one or two sentences, and a judge that writes megabytes must not copy them into every rollout.
MAX_EXPLANATION_CHARS = 2000


def _bounded(explanation: str) -> str:
    if len(explanation) <= MAX_EXPLANATION_CHARS:
        return explanation
    return f"{explanation[:MAX_EXPLANATION_CHARS]}... [{len(explanation) - MAX_EXPLANATION_CHARS} more characters cut]"


def parse_answer(raw: str | None, ids: Sequence[str]) -> dict[str, Score]:
    """Scores by id, or BadAnswer with every problem found: whatever the judge's text, a bad answer is a
    BadAnswer (retried, repaired, then a JudgeError), never another exception."""
    if raw is None or not raw.strip():
        raise BadAnswer(["the answer is empty (no content in the judge's message)"], raw)
    text = _strip(raw)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadAnswer([f"the answer is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"], raw) from None
    except (ValueError, RecursionError) as e:
        # JSON that Python's reader refuses past its own limits: an integer of more than 4300 digits
        # (ValueError), arrays or objects nested past the recursion limit. The judge's fault, not ours.
        raise BadAnswer([f"the answer is JSON this parser refuses ({type(e).__name__}: {str(e)[:120]})"], raw) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("scores"), list):
        raise BadAnswer(['the answer must be a JSON object with a "scores" list'], raw)
    wanted = list(ids)
    problems: list[str] = []
    found: dict[str, Score] = {}
    seen_twice: list[str] = []
    for i, entry in enumerate(obj["scores"]):
        if not isinstance(entry, dict):
            problems.append(f"scores[{i}] is not an object")
            continue
        tid = entry.get("trajectory_id")
        if isinstance(tid, bool) or not isinstance(tid, (str, int)):
            problems.append(f"scores[{i}] has no string trajectory_id")
            continue
        tid = str(tid).strip()
        if tid not in wanted:
            problems.append(f"scores[{i}] names trajectory_id {tid!r}, which was not shown (ids: {wanted})")
            continue
        score = entry.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            problems.append(f"trajectory {tid}: score {score!r} is not a number")
            continue
        try:
            score = float(score)
        except OverflowError:  # an integer past float's range (1 followed by 400 zeros)
            score = math.inf
        if not math.isfinite(score) or not 0.0 <= score <= 1.0:
            problems.append(f"trajectory {tid}: score {score!r} is outside [0, 1]")
            continue
        explanation = entry.get("explanation", "")
        if not isinstance(explanation, str):
            problems.append(f"trajectory {tid}: explanation is not a string")
            continue
        if tid in found:
            seen_twice.append(tid)
            continue
        found[tid] = Score(score=score, explanation=_bounded(explanation.strip()))
    if seen_twice:
        problems.append(f"trajectory ids scored more than once: {sorted(set(seen_twice))}")
    missing = [t for t in wanted if t not in found and t not in _ids_with_problems(problems)]
    if missing:
        problems.append(f"no score for trajectory ids {missing} (expected exactly one entry per id: {wanted})")
    if problems:
        raise BadAnswer(problems, raw)
    return found


def _ids_with_problems(problems: list[str]) -> set[str]:
    # An id whose entry was invalid is already reported; do not report it as missing too.
    return {p.split(":")[0].removeprefix("trajectory ").strip() for p in problems if p.startswith("trajectory ")}


def repair_message(error: BadAnswer, ids: Sequence[str]) -> dict[str, str]:
    """The follow-up user message of the single repair attempt (endpoints without JSON schema)."""
    example = json.dumps(
        {"scores": [{"trajectory_id": t, "explanation": "...", "score": 0.5} for t in ids[:2]]}
    )
    return {
        "role": "user",
        "content": (
            f"Your answer could not be used: {error}. Reply again with only one JSON object, no other text, "
            f"with exactly one entry for each of the ids {list(ids)} and scores between 0 and 1, like: {example}"
        ),
    }

