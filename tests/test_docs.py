"""docs/architecture.md's file tree lists every module, bench and script of the repository."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_architecture_file_tree_lists_every_module():
    tree = (REPO / "docs/architecture.md").read_text().split("## File tree", 1)[1]
    listed = {line.split()[0] for line in tree.splitlines() if line.startswith(("src/", "bench/", "scripts/"))}
    files = {p.relative_to(REPO).as_posix() for d in ("src", "bench", "scripts") for p in (REPO / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".md") and "__pycache__" not in p.parts}
    assert files - listed == set(), "run `python scripts/file_tree.py` to update docs/architecture.md"
    assert listed - files == set(), "docs/architecture.md lists files that no longer exist"
