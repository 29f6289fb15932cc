"""Questions with ground-truth answers and source ids, split 80/10/10, and the answer grader.

Each `Fact` of the corpus (inbox.py) is one question. The split is by question id with a fixed seed, so
every run sees the same validation and test questions; the run seed only reorders the training ones.

Grading (`is_correct`) is exact match after normalisation: lower case, "$", commas and punctuation
dropped, whitespace collapsed, a leading "the"/"a"/"an" dropped. One slack, documented because it is a
choice: an answer that contains the truth as whole words plus at most `EXTRA_WORDS` (3) more words is
correct ("Room 4B" for "4B", "The code is BAVN8W" for "BAVN8W"); a longer answer is not (an answer that
lists several candidates must not win by containing the right one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from groupwise.envs.email_search.inbox import Corpus

EXTRA_WORDS = 3
IDK_PHRASES = ("i don't know", "i do not know", "unknown", "not found", "no answer", "cannot find", "can't find")


@dataclass(frozen=True)
class Question:
    id: str
    inbox: str
    question: str
    answer: str
    source_id: str
    keywords: tuple[str, ...]
    kind: str
    today: str  # the day the question is asked (after every email of the corpus), YYYY-MM-DD


def questions_from_corpus(corpus: Corpus) -> list[Question]:
    today = max(e.date for e in corpus.emails)[:10]
    return [
        Question(id=f"q-{f.source_id}", inbox=f.inbox, question=f.question, answer=f.answer, source_id=f.source_id,
                 keywords=f.keywords, kind=f.kind, today=today)
        for f in corpus.facts
    ]


def split_questions(questions: list[Question], *, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
                    split_seed: int = 0) -> tuple[list[Question], list[Question], list[Question]]:
    """Deterministic 80/10/10 split (the same for every run seed), by `groupwise.core.split_dataset`.

    Sorted by id first, so the assignment does not depend on the order questions were generated in.
    """
    from groupwise.core.split_dataset import split_dataset

    train, val, test = split_dataset(sorted(questions, key=lambda q: q.id), fractions, seed=split_seed)
    return train, val, test


def normalise(text: str) -> list[str]:
    text = (text or "").lower().replace("$", "").replace(",", "")
    words = re.sub(r"[^\w\s-]", " ", text).replace("-", "").split()
    if words and words[0] in ("the", "a", "an"):
        words = words[1:]
    return words


def is_idk(answer: str) -> bool:
    a = (answer or "").strip().lower()
    return not a or any(p in a for p in IDK_PHRASES)


def is_correct(answer: str, truth: str) -> bool:
    got, want = normalise(answer), normalise(truth)
    if not want:
        return False
    if got == want:
        return True
    if len(got) > len(want) + EXTRA_WORDS:
        return False
    return any(got[i:i + len(want)] == want for i in range(len(got) - len(want) + 1))
