"""Text a conversation may hold that UTF-8 cannot: lone UTF-16 surrogates.

A lone surrogate (U+D800..U+DFFF) is a valid Python str character with no UTF-8 encoding. A model's
JSON can carry one (``"\\ud800"`` parses to it), and so can a tool's output decoded with
surrogateescape. Each place that must encode such text says what it becomes there: the run store
writes it as its escape (groupwise.runs.history), a built-in env sends it escaped (envs/_chat.py), the
trainer tokenises it as U+FFFD (training/tokenize.py).
"""

import re

__all__ = ["LONE_SURROGATE"]

# In a str a surrogate code point is always a lone one: a pair is one character.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")
