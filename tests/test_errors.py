"""One error hierarchy: every error groupwise raises on purpose is a GroupwiseError (errors.py).

Checked on the source with `ast` (every exception class defined in src/groupwise, every bare
``raise RuntimeError(...)``-style raise), and on the classes users meet most, imported.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import groupwise as gw

SRC = Path(__file__).resolve().parents[1] / "src" / "groupwise"

# Exceptions that never leave groupwise: each is caught where it is raised and turned into an answer.
INTERNAL = {
    "BadAnswer": "judge/parse.py: the judge's unusable answer; the judge retries, then raises JudgeError",
    "ApiError": "inference/server.py: becomes the HTTP error response the client receives",
    "ToolError": "envs/email_search: a tool's error, returned to the agent as the tool's answer",
    "_Retryable": "judge/ruler.py: a failed judge attempt; the judge retries, then raises JudgeError",
}
# Raising these directly says nothing about what went wrong in groupwise terms.
GENERIC = {"Exception", "RuntimeError", "FloatingPointError"}
BUILTIN_EXCEPTIONS = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
                      and issubclass(getattr(builtins, n), BaseException)}


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _base_names(node: ast.ClassDef) -> list[str]:
    return [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases if isinstance(b, ast.Name | ast.Attribute)]


def test_every_exception_class_of_the_package_is_a_groupwise_error():
    bases: dict[str, list[str]] = {}
    where: dict[str, str] = {}
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, []).extend(_base_names(node))
                where[node.name] = str(path.relative_to(SRC))

    def reaches(name: str, target: str, seen: frozenset = frozenset()) -> bool:
        if name == target:
            return True
        return name not in seen and any(reaches(b, target, seen | {name}) for b in bases.get(name, []))

    errors = {n for n in bases if any(reaches(n, e) for e in BUILTIN_EXCEPTIONS) and n not in BUILTIN_EXCEPTIONS
              and not reaches(n, "Warning") and not reaches(n, "UserWarning")}  # warnings are not errors
    assert {"GroupwiseError", "EngineError", "ConstraintError", "ConfigError"} <= errors  # the scan sees them
    outside = sorted(f"{where[n]}: {n}" for n in errors if not reaches(n, "GroupwiseError") and n not in INTERNAL)
    assert outside == [], "derive these from GroupwiseError (with the stdlib base where it fits)"


def test_no_generic_raise():
    found = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                if node.exc.func.id in GENERIC:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} raise {node.exc.func.id}")
    assert found == [], "raise a GroupwiseError subclass that names the failure"


def test_the_errors_users_meet_are_caught_by_one_except_and_keep_their_stdlib_base():
    pytest.importorskip("torch")
    from groupwise.errors import EnvError, NonFiniteError
    from groupwise.inference.constrained import ConstraintError
    from groupwise.inference.requests import EngineError, PromptTooLongError

    for cls, std in ((EngineError, RuntimeError), (PromptTooLongError, ValueError), (ConstraintError, ValueError),
                     (NonFiniteError, FloatingPointError), (EnvError, RuntimeError), (gw.ConfigError, ValueError)):
        assert issubclass(cls, gw.GroupwiseError) and issubclass(cls, std), cls


# Areas whose every raise is a GroupwiseError already; the others still raise some plain ValueError,
# TypeError or KeyError on a wrong argument (errors.py says so).
CONVERTED = ("judge", "loop", "learning_signal.py", "backend/judges.py", "errors.py")


def test_the_judge_and_the_loop_raise_only_groupwise_errors():
    found = []
    for path, tree in _modules():
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith(CONVERTED):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
                if node.exc.func.id in BUILTIN_EXCEPTIONS:
                    found.append(f"{rel}:{node.lineno} raise {node.exc.func.id}")
    assert found == [], "raise ConfigError (a ValueError) or another GroupwiseError"
