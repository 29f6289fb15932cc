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
    "_Unreachable": "judge/ruler.py: an attempt that reached no server; the judge retries, then raises JudgeUnreachableError",
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


# The only places groupwise raises a plain built-in exception: each is a protocol where the built-in class
# is what the caller (Python, pydantic, the code right below) expects, never what a user meets as is.
ALLOWED_BUILTIN_RAISES = {
    ("art/local/__init__.py", "AttributeError"): "module __getattr__: Python's protocol for a missing attribute",
    ("art/local/api.py", "AttributeError"): "module __getattr__: Python's protocol for a missing attribute",
    ("art/skypilot/__init__.py", "AttributeError"): "module __getattr__: Python's protocol for a missing attribute",
    ("core/trajectory.py", "AttributeError"): "module __getattr__ (ART's names that live elsewhere): Python's protocol",
    ("backend/base.py", "NotImplementedError"): "a Backend method this backend does not offer (Python's protocol)",
    ("model.py", "ValueError"): "a pydantic field validator: pydantic reports it inside its ValidationError",
    ("core/trajectory.py", "ValueError"): "pydantic field validators: pydantic reports them inside its ValidationError",
    ("core/readers.py", "ValueError"): "pydantic validators of a file's rows: read_rows reports them as a RowError",
    ("inference/api_models.py", "ValueError"): "pydantic validators of a request: the server answers 400 with them",
    ("inference/api_messages.py", "ValueError"): "pydantic validators of a request: the server answers 400 with them",
    ("inference/adapter_routes.py", "ValueError"): "pydantic validators of a LoRA route's body: the server answers 400 with them",
    ("inference/request_limits.py", "ValueError"): "called from the request models' validators only (as above)",
    ("inference/prepare.py", "ValueError"): "check_json_schema's; check_request_schemas turns it into SchemaProblem",
    ("jobs/fields.py", "ValueError"): "parse_text's: the CLI turns it into argparse's error for that flag",
    ("training/checkpoint_contents.py", "ValueError"): "caught a line below: becomes the checkpoint's problem text",
}


def builtin_raises(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of every ``raise ValueError(...)`` / ``raise StopIteration``-style raise of a built-in
    exception class. A re-raise (``raise``, ``raise exc``) and a raise of a groupwise class are not."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in BUILTIN_EXCEPTIONS:
                found.append((node.lineno, target.id))
    return sorted(found)


def test_everything_groupwise_raises_on_purpose_is_a_groupwise_error():
    found, used = [], set()
    for path, tree in _modules():
        rel = path.relative_to(SRC).as_posix()
        for line, name in builtin_raises(tree):
            if (rel, name) in ALLOWED_BUILTIN_RAISES:
                used.add((rel, name))
            else:
                found.append(f"{rel}:{line} raise {name}")
    assert found == [], ("raise a GroupwiseError subclass that keeps the built-in base (ConfigError for a bad "
                         "value, ArgumentTypeError for a bad type, errors.py lists the others), or add the "
                         "site to ALLOWED_BUILTIN_RAISES with the protocol that needs the built-in class")
    assert set(ALLOWED_BUILTIN_RAISES) - used == set(), "an allowed site no longer raises: drop it from the list"


def test_the_raise_scan_sees_a_bare_raise_and_lets_re_raises_through():
    source = """
def f(x, exc):
    if x:
        raise ValueError("bad x")
    try:
        g()
    except OSError:
        raise
    if exc:
        raise exc
    raise StopIteration
raise gw.ConfigError("fine")
raise KeyError
"""
    assert builtin_raises(ast.parse(source)) == [(4, "ValueError"), (11, "StopIteration"), (13, "KeyError")]


def test_converted_errors_keep_their_builtin_base_and_say_what_to_do():
    from groupwise.envs import get_env
    from groupwise.envs.tictactoe.game import play

    with pytest.raises(KeyError, match="no environment 'chess'; the built-in ones are") as err:
        get_env("chess")
    assert isinstance(err.value, gw.GroupwiseError)
    with pytest.raises(ValueError, match="cell 0 is not a legal move") as err:
        play("X        ", 0)
    assert isinstance(err.value, gw.ConfigError)
    model = gw.TrainableModel(name="m", project="p", base_model="x")
    with pytest.raises(TypeError, match="register\\(\\) takes a groupwise Backend, got str") as err:
        import asyncio

        asyncio.run(model.register("not a backend"))
    assert isinstance(err.value, gw.GroupwiseError)
