r"""Find the final answer in a reply and compare it exactly.

Which answer counts, in this order (the first rule that applies decides, later ones are not tried):

1. ``\boxed{...}``: when the reply has one, the LAST boxed expression is the answer; it must be a number
   alone (``\boxed{42}``, ``\boxed{ -7 }``, ``\boxed{1,234}``, ``\boxed{\$5}``). ``\boxed{}`` or
   ``\boxed{x+1}`` is rejected (None): the reply committed to a non-answer, we do not guess.
2. ``Answer: 42`` / ``answer is 42`` / ``answer = 42`` (any case; the last such marker): the number right
   after the marker (a ``$`` before it and words after it are fine: ``Answer: $12 apples``). A marker
   followed by no number (``Answer: forty-two``) is rejected.
3. Only when ``strict=False`` (the default): the last number anywhere in the reply.

Numbers: an optional minus sign, digits with optional thousands commas (``1,234``), an optional
decimal part (``42.0`` equals 42). Fractions (``3/4``), words (``seven``) and scientific notation are
not read as numbers. Values are returned as exact `Fraction`s, so ``42.0 == 42`` and nothing rounds.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
# Not part of a longer number or a fraction: no digit, "digit," or "digit/" before it; no digit,
# ",digit", ".digit" or "/digit" after it.
_NUMBER_RE = re.compile(rf"(?<![\d.])(?<!\d,)(?<!\d/){_NUMBER}(?!\d|,\d|\.\d|/\d)")
_BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
# Possessive (*+): a whitespace run is never split between two \s* beside it, which made a long run of
# whitespace in a reply cost the square of its length (a minute for a box of 40,000 spaces).
_BOXED_ALONE_RE = re.compile(rf"\s*+\\?\$?\s*+({_NUMBER})\s*+\.?\s*+")  # fullmatch
_MARKER_RE = re.compile(r"answer\s*+(?:is\s*+:?|:|=)", re.IGNORECASE)
_AFTER_MARKER_RE = re.compile(rf"\s*+\**+\s*+\\?\$?\s*+({_NUMBER})(?!\d|,\d|\.\d|/\d)")  # match


def to_number(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def parse_answer(text: str, *, strict: bool = False) -> Fraction | None:
    """The final answer of a reply as an exact number, or None when there is none (see module doc)."""
    text = text or ""
    boxed = _BOXED_RE.findall(text)
    if boxed:
        m = _BOXED_ALONE_RE.fullmatch(boxed[-1])
        return to_number(m.group(1)) if m else None
    markers = list(_MARKER_RE.finditer(text))
    if markers:
        m = _AFTER_MARKER_RE.match(text[markers[-1].end():])
        return to_number(m.group(1)) if m else None
    if strict:
        return None
    numbers = _NUMBER_RE.findall(text)
    return to_number(numbers[-1]) if numbers else None


def is_correct(text: str, answer: int, *, strict: bool = False) -> bool:
    parsed = parse_answer(text, strict=strict)
    return parsed is not None and parsed == answer
