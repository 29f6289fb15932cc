"""docs/architecture.md's file tree lists every module, bench and script of the repository."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_architecture_file_tree_lists_every_module():
    tree = (REPO / "docs/architecture.md").read_text().split("## File tree", 1)[1]
    listed = {line.split()[0] for line in tree.splitlines() if line.startswith(("src/", "bench/", "scripts/"))}
    files = {p.relative_to(REPO).as_posix() for d in ("src", "bench", "scripts") for p in (REPO / d).rglob("*")
             if p.is_file() and p.suffix in (".py", ".md") and "__pycache__" not in p.parts}
    assert files - listed == set(), "run `python scripts/file_tree.py` to update docs/architecture.md"
    # the tree lists every tracked file (the dashboard's static files too); each must still exist
    assert {p for p in listed if not (REPO / p).is_file()} == set(), "docs/architecture.md lists files that no longer exist"


DOCS = [REPO / "README.md", REPO / "pyproject.toml", *sorted((REPO / "docs").glob("*.md"))]


def _markdown_names() -> set[str]:
    """The names of the repository's .md files, outside hidden folders (.git, a venv such as CI's .ci/venv,
    whose packages hold thousands of files no doc cites)."""
    import os

    names = set()
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "__pycache__")]
        names.update(f for f in files if f.endswith(".md"))
    return names


def test_every_file_the_docs_cite_exists():
    # a cited path (docs/x.md, src/..., tests/...) or a bare *.md name must be a file of the repository
    import re

    missing = []
    markdown = _markdown_names()
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"(?<![\w/.<-])((?:docs|src|tests|bench|scripts)/[\w./-]*[\w-]\.(?:md|py|toml|json))\b", text):
            if not (REPO / m.group(1)).exists():
                missing.append(f"{doc.name}: {m.group(1)}")
        for m in re.finditer(r"\b([\w-]+\.md)\b", text):
            if m.group(1) not in markdown:
                missing.append(f"{doc.name}: {m.group(1)}")
    assert missing == []


def test_the_docs_put_the_loop_cursor_in_the_checkpoints():
    # gw.fit saves its data cursor with each checkpoint (checkpoints/<step>/state.json), not in the run's
    # state.json, which is the user's (ART's model.write_state)
    import re

    for doc in [*DOCS, REPO / "src/groupwise/runs/store.py"]:
        for sentence in re.split(r"(?<=[.|])\s", doc.read_text()):
            if "cursor" in sentence and "state.json" in sentence:
                assert "checkpoint" in sentence, f"{doc.name}: {sentence.strip()[:200]}"
