"""The READMEs inside src/groupwise say what the code is: their file trees list exactly the modules
that exist, and the env table gives each env's train preset (`groupwise.jobs.train.PRESETS`) and answer length."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from groupwise.envs import ENVS

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "groupwise"
READMES = sorted(PACKAGE.rglob("README.md"))


def listed_files(readme: Path) -> set[str] | None:
    """Names in the README's tree block (a fenced block whose first line is ``<folder>/``), or None."""
    for block in re.findall(r"```\n(.*?)```", readme.read_text(), flags=re.S):
        lines = block.splitlines()
        if lines and lines[0].strip() == f"{readme.parent.name}/":
            return {m.group(1) for line in lines[1:] if (m := re.match(r"^  ([\w.]+(?:\.py|/))(\s|$)", line))}
    return None


def present_files(folder: Path) -> set[str]:
    files = {p.name for p in folder.glob("*.py") if p.name != "__init__.py"}
    return files | {f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()}


def test_the_readmes_with_trees_are_found():
    with_trees = {r.parent.name for r in READMES if listed_files(r) is not None}
    assert {"loop", "envs", "email_search", "game_2048", "math", "oneword", "tictactoe", "titles"} <= with_trees


@pytest.mark.parametrize("readme", READMES, ids=lambda r: str(r.relative_to(PACKAGE)))
def test_a_readme_tree_lists_every_module_and_only_those(readme):
    listed = listed_files(readme)
    if listed is None:
        pytest.skip(f"{readme} has no file tree")
    listed.discard("__init__.py")
    present = present_files(readme.parent)
    assert listed - present == set(), f"{readme} lists files that do not exist"
    assert present - listed == set(), f"{readme} does not list these modules"


def test_the_env_table_gives_each_envs_defaults():
    rows = {}
    for line in (PACKAGE / "envs" / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (m := re.fullmatch(r"(\d+) x (\d+) x (\d+), (\d+), ([\d.e-]+).*", cells[3])):
            rows[cells[0]] = tuple(float(g) for g in m.groups())
            rows[cells[0], "sft"] = int(s.group(1)) if (s := re.search(r"after (\d+) demonstrations", cells[3])) else 0
    assert {k for k in rows if isinstance(k, str)} == set(ENVS), "every env has one row in envs/README.md's table"
    from groupwise.jobs.train import PRESETS

    for name, spec in ENVS.items():
        p, max_tokens = PRESETS[name], spec.scenarios(0)[0][0].max_tokens  # the job's preset; the env's answer length
        code = (p.steps, p.groups_per_step, p.rollouts_per_group, max_tokens, p.learning_rate)
        assert rows[name] == tuple(float(v) for v in code), name
        assert rows[name, "sft"] == p.sft, f"{name}: the table names the warm start of its preset"  # e.g. tictactoe
