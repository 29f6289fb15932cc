"""The folders are the layer map: ART's paths in the wing (groupwise/art/), the client-side core, the run
store, the torch-side helpers; the old paths (ART's, and groupwise's own before the move) still load the
same module objects; type checkers see every public name."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import groupwise
from groupwise.art.aliases import ALIASES, new_path

SRC = Path(groupwise.__file__).parent


def _exports() -> dict[str, str]:
    for node in ast.walk(ast.parse((SRC / "__init__.py").read_text())):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_EXPORTS":
            return ast.literal_eval(node.value)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_EXPORTS":
            return ast.literal_eval(node.value)
    raise AssertionError("no _EXPORTS in groupwise/__init__.py")


def test_the_top_level_keeps_a_handful_of_modules():
    assert sorted(p.stem for p in SRC.glob("*.py")) == ["__init__", "__main__", "cli", "config", "errors", "model"]
    packages = sorted(p.name for p in SRC.iterdir() if (p / "__init__.py").exists())
    assert {"art", "core", "runs", "runtime"} <= set(packages)


def test_every_old_path_loads_the_one_module_at_its_new_path():
    for old, new in sorted(ALIASES.items()):
        moved = importlib.import_module(f"groupwise.{new}")
        assert importlib.import_module(f"groupwise.{old}") is moved, old
        assert moved.__spec__.name == f"groupwise.{new}", old  # its own spec, not the alias's
        assert not (SRC / (old.replace(".", "/") + ".py")).exists(), f"{old} is both moved and present"


def test_a_submodule_under_a_moved_package_is_not_loaded_twice():
    # a fresh interpreter: the old path first, then the new one
    code = ("import groupwise.dev.engine as a, groupwise.art.dev.engine as b, sys\n"
            "assert a is b and sys.modules['groupwise.dev.engine'] is sys.modules['groupwise.art.dev.engine']\n"
            "import groupwise.utils.retry\nimport groupwise.utils as u\n"
            "assert callable(u.retry) and not isinstance(u.retry, type(sys)), u.retry\n"  # ART: the decorator
            "from groupwise.utils.output_dirs import get_model_dir\n"
            "from groupwise.runs.output_dirs import get_model_dir as g\nassert get_model_dir is g\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_finder_answers_old_paths_only():
    assert new_path("groupwise.store") == "groupwise.runs.store"
    assert new_path("groupwise.utils.retry") == "groupwise.core.retry"
    assert new_path("groupwise.utils.sft") == "groupwise.art.utils.sft"
    assert new_path("groupwise.dev.engine") == "groupwise.art.dev.engine"
    for current in ("groupwise", "groupwise.loop.fit", "groupwise.runs.store", "groupwise.art.utils", "storehouse"):
        assert new_path(current) is None, current


def test_a_moved_module_is_still_an_attribute_of_the_package():
    assert groupwise.types.Trajectory is groupwise.Trajectory
    assert groupwise.store.load_history is groupwise.load_history


def test_type_checkers_see_every_public_name():
    seen: dict[str, str] = {}
    for node in ast.walk(ast.parse((SRC / "__init__.py").read_text())):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    seen.update({alias.asname or alias.name: stmt.module for alias in stmt.names})
    for name, module in _exports().items():
        assert seen.get(name) == module, f"{name}: add `from {module} import {name}` under TYPE_CHECKING"
        assert getattr(groupwise, name) is getattr(importlib.import_module(module), name), name
