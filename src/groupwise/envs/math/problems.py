"""Generated arithmetic and word problems with exact integer answers (seeded, no I/O, no LLM).

`make_problem(seed, level)` is a pure function of its arguments. Levels:

1. one operation on small numbers: ``7 + 5``, ``12 - 4``, and one-step word problems;
2. one operation on two-digit numbers, multiplication tables, two-step word problems;
3. two operations with precedence (``3 + 4 * 5``), three-digit numbers, division with exact results.

Every answer is an integer, so grading is exact (no rounding rules to argue about).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from groupwise.errors import ConfigError

EASIEST, HARDEST = 1, 3  # the levels (module doc); a scenario that names none is the easiest
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemi", "Liam")
ITEMS = ("apples", "stickers", "marbles", "books", "pencils", "shells", "cards", "coins", "buttons", "stamps")


@dataclass(frozen=True)
class Problem:
    question: str
    answer: int
    kind: str  # "arithmetic" or "word"
    level: int


def _arithmetic(rng: random.Random, level: int) -> tuple[str, int]:
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        op = rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a  # keep level-1 answers non-negative
    elif level == 2:
        op = rng.choice("+-*")
        if op == "*":
            a, b = rng.randint(2, 9), rng.randint(2, 12)
        else:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
    else:
        op = rng.choice(["+*", "-*", "*+", "/", "+-"])
        if op == "/":
            b = rng.randint(2, 12)
            a = b * rng.randint(2, 30)
            return f"What is {a} / {b}?", a // b
        a, b, c = rng.randint(2, 99), rng.randint(2, 12), rng.randint(2, 12)
        expr = f"{a} {op[0]} {b} {op[1]} {c}"
        # eval of a string we built from ints and + - * only: precedence as Python (and school) has it
        return f"What is {expr}?", int(eval(expr))  # noqa: S307
    expr = f"{a} {op} {b}"
    return f"What is {expr}?", int(eval(expr))  # noqa: S307


def _word(rng: random.Random, level: int) -> tuple[str, int]:
    name, friend = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    if level == 1:
        a, b = rng.randint(2, 9), rng.randint(1, 9)
        if rng.random() < 0.5:
            return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?", a + b
        a = a + b  # so that a - b >= 1
        return f"{name} has {a} {item} and gives {b} to {friend}. How many {item} does {name} have left?", a - b
    if level == 2:
        a, b, c = rng.randint(10, 40), rng.randint(2, 15), rng.randint(2, 15)
        return (
            f"{name} has {a} {item}. {name} gives {b} to {friend} and then finds {c} more. "
            f"How many {item} does {name} have?",
            a - b + c,
        )
    boxes, per_box, extra = rng.randint(3, 12), rng.randint(4, 25), rng.randint(1, 30)
    return (
        f"{name} buys {boxes} boxes of {item} with {per_box} {item} in each box, and already had {extra}. "
        f"How many {item} does {name} have in total?",
        boxes * per_box + extra,
    )


def make_problem(seed: int, level: int = EASIEST) -> Problem:
    """One problem, fully determined by (seed, level). About half arithmetic, half word problems."""
    if level not in range(EASIEST, HARDEST + 1):
        raise ConfigError(f"level={level!r}; levels are 1, 2 and 3 (see the module docstring)",
                          what="math problem level")
    rng = random.Random(f"math:{seed}:{level}")
    kind = "word" if rng.random() < 0.5 else "arithmetic"
    question, answer = (_word if kind == "word" else _arithmetic)(rng, level)
    return Problem(question=question, answer=answer, kind=kind, level=level)
