"""`groupwise sft FILE` and `groupwise judge eval --labels FILE` with a bad row: exit code 1, one line on
stderr naming the file and line, no traceback, and no model loaded (the file is read first): real
processes, with a model that would fail to load had the command got that far."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NO_MODEL = "no-such-org/model-that-would-fail-to-load"
# Runs the CLI and then says whether torch was ever imported: a model load imports it first.
RUN = ("import sys; from groupwise.cli import main; rc = main(sys.argv[1:]); "
       "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH'); sys.exit(rc)")

SFT_OK = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]})
GROUP = {"messages": [{"role": "user", "content": "q"}], "trajectories": [{"answer": "a", "label": 1}]}


def groupwise(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OPENAI_API_KEY="")
    return subprocess.run([sys.executable, "-c", RUN, *args], capture_output=True, text=True, timeout=300, env=env)


def _row(label: str) -> str:
    return json.dumps(GROUP)[:-2] + ', {"answer": "b", "label": ' + label + "}]}"


SFT_CASES = {"array": "[1, 2]", "string": '"demo"', "number": "42", "deep": "[" * 100_000 + "]" * 100_000,
             "no-messages": '{"tools": []}', "nan": '{"messages": [{"role": "user", "content": NaN}]}'}
LABEL_CASES = {"array": "[1]", "string": '"x"', "number": "3", "deep": "[" * 100_000,
               "text-label": _row('"0.9"'), "null-label": _row("null"), "nan-label": _row("NaN"),
               "inf-label": _row("Infinity"), "missing-label": json.dumps(GROUP)[:-2] + ', {"answer": "b"}]}'}


def _check(proc: subprocess.CompletedProcess, path: Path, command: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith(f"groupwise {command}: error: {path}:2: "), lines[0]
    assert "expected" in lines[0]
    assert proc.stdout.strip().splitlines()[-1] == "NO-TORCH"  # refused before any model (or torch) loaded


@pytest.mark.parametrize("case", sorted(SFT_CASES))
def test_groupwise_sft_with_a_bad_row_is_one_line_exit_1_before_loading(tmp_path, case):
    path = tmp_path / "demos.jsonl"
    path.write_text(SFT_OK + "\n" + SFT_CASES[case] + "\n")
    store = tmp_path / "store"
    proc = groupwise("sft", str(path), "--model", NO_MODEL, "--path", str(store))
    _check(proc, path, "sft")
    assert not store.exists() or not any(store.rglob("history.jsonl"))  # no run was started


@pytest.mark.parametrize("case", sorted(LABEL_CASES))
def test_groupwise_judge_eval_with_a_bad_label_row_is_one_line_exit_1_before_loading(tmp_path, case):
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({**GROUP, "trajectories": GROUP["trajectories"] * 2}) + "\n" + LABEL_CASES[case] + "\n")
    proc = groupwise("judge", "eval", "--labels", str(path), "--judge", f"local/{NO_MODEL}")
    _check(proc, path, "judge eval")
