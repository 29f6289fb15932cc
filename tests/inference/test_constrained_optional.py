"""llguidance is needed only by requests that ask for constrained output."""

import sys

import pytest

from groupwise.errors import MissingDependencyError
from groupwise.inference.constrained import constraint_for

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.fixture
def without_llguidance(monkeypatch):
    for name in [m for m in sys.modules if m == "llguidance" or m.startswith("llguidance.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "llguidance", None)  # `import llguidance` now raises ImportError


def test_plain_requests_need_no_llguidance(without_llguidance):
    assert constraint_for(None) is None
    assert constraint_for(None, response_format={"type": "text"}, tools=TOOLS, tool_choice="auto") is None


@pytest.mark.parametrize("kwargs", [
    {"response_format": {"type": "json_object"}},
    {"tools": TOOLS, "tool_choice": "required"},
])
def test_a_constrained_request_without_llguidance_names_the_missing_package(without_llguidance, kwargs):
    with pytest.raises(MissingDependencyError, match="llguidance"):
        constraint_for(None, **kwargs)
