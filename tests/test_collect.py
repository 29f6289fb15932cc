"""pytest collects the test folders in any order and any combination.

Every folder's conftest.py is a module named ``conftest`` and, with pytest's default import mode, each
test folder goes onto sys.path under its bare module names: a helper imported by name
(``from conftest import x``, or two folders each with a ``helpers.py``) resolves to whichever folder
pytest reached first, so ``pytest tests/judge tests/envs`` failed to collect while ``pytest tests`` passed.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# ART's own programs, kept as ART wrote them (notebook cells with `!pip` lines, module names such as
# rollout.py that ART reuses): inputs that art_runner.py runs from a copy, never collected or imported
VENDORED = TESTS / "art_compat" / "art_repo"
# third-party ART programs (their own module names: train.py, rollout.py), run the same way
CORPUS = TESTS / "art_compat" / "corpus"


def _test_sources():
    return [p for p in TESTS.rglob("*.py") if VENDORED not in p.parents and CORPUS not in p.parents]


def test_no_module_imports_a_conftest_by_name():
    found = []
    for path in _test_sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(TESTS)}:{node.lineno}" for n in names if n.split(".")[-1] == "conftest"]
    assert found == [], "import helpers from a uniquely named module (e.g. judge_helpers.py), not conftest"


def test_module_names_are_unique_across_test_folders():
    # a module inside a package (a folder with __init__.py: an OpenEnv env laid out as `openenv init` makes
    # it, a seam standing in for a package) is imported by its qualified name and clashes with nothing
    bare = [p for p in _test_sources() if not (p.parent / "__init__.py").is_file()]
    names = Counter(p.name for p in bare if p.name != "conftest.py")
    assert [n for n, c in names.items() if c > 1] == []


@pytest.mark.parametrize("folders", [("judge", "envs"), ("envs", "judge")])
def test_folders_collect_in_any_order(folders):
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           *(str(TESTS / f) for f in folders)], capture_output=True, text=True, cwd=TESTS.parent,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " error" not in done.stdout.splitlines()[-1], done.stdout[-3000:]
