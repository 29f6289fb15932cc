"""History appends are idempotent per row key; corrupt lines are named when skipped."""

from __future__ import annotations

import json
import warnings

import pytest

from groupwise import CorruptRecordError, load_history
from groupwise.runs.store import RunStore, history_key


def test_appending_a_row_twice_keeps_one_and_the_newest_wins(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    store.append_history({"step": 0, "split": "train", "reward": 0.1})
    store.append_history({"step": 0, "split": "val", "reward": 0.2})
    store.append_history({"step": 1, "split": "train", "reward": 0.3})
    # a redone step (resumed after a crash) writes its row again: replaced in place, not duplicated
    assert store.append_history({"step": 0, "split": "train", "reward": 0.15})
    rows = store.history()
    assert [(r["step"], r["split"], r["reward"]) for r in rows] == [(0, "train", 0.15), (0, "val", 0.2), (1, "train", 0.3)]
    # a replay of a row that is there already changes nothing
    assert not store.append_history({"step": 1, "split": "train", "reward": 9.0}, if_missing=True)
    assert store.append_history({"step": 2, "split": "train", "reward": 0.4}, if_missing=True)
    assert [r["reward"] for r in store.history()] == [0.15, 0.2, 0.3, 0.4]
    assert not list(store.run_dir.glob(".history.jsonl.*.tmp"))  # the rewrite left no temp file


def test_rows_with_a_kind_name_or_message_are_their_own(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    base = {"step": 0, "split": "baseline"}
    store.append_history({**base, "kind": "base", "name": "agent@0", "reward": 0.1})
    store.append_history({**base, "kind": "model", "name": "gpt", "reward": 0.5})
    store.append_history({"step": 3, "split": "alert", "name": "no_signal", "message": "attempt 1: all equal"})
    store.append_history({"step": 3, "split": "alert", "name": "no_signal", "message": "attempt 2: all equal"})
    store.append_history({**base, "kind": "model", "name": "gpt", "reward": 0.6})  # the same baseline again
    rows = store.history()
    assert len(rows) == 4 and rows[1]["reward"] == 0.6
    assert history_key(rows[2]) != history_key(rows[3])


def test_a_corrupt_line_that_is_not_torn_still_raises(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    store.append_history({"step": 0, "split": "val"})
    with open(store.history_path, "a") as f:
        f.write('{"step": 1, "split": "val", oops}\n')  # whole but broken: not a crash mid-append
    store.append_history({"step": 2, "split": "val"})
    with pytest.raises(CorruptRecordError, match="history.jsonl:2"):
        load_history(store.run_dir)
    with pytest.warns(UserWarning, match=r"history.jsonl:2: skipped \(not valid JSON"):
        assert [r["step"] for r in load_history(store.run_dir, skip_corrupt=True)] == [0, 2]


def test_skip_corrupt_trajectories_warn_with_file_and_line(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("val", 0, [group, group])
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + '{"not": "a group"}\n' + lines[1][:40] + "\n")
    with pytest.raises(CorruptRecordError, match="0000.jsonl:2"):
        store.load_trajectories()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(store.load_trajectories(skip_corrupt=True)) == 1
    said = [str(w.message) for w in caught]
    assert any("0000.jsonl:2: skipped (not a TrajectoryGroup" in m for m in said)
    assert any("0000.jsonl:3: skipped" in m for m in said)
    json.loads(lines[0])  # (the first line was intact)
