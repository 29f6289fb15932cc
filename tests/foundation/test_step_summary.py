"""The step summary the store writes beside each trajectory file (groupwise.runs.step_summary): what it holds,
and that a reader trusts it only while it describes the step file beside it."""

from __future__ import annotations

import json
import os
import shutil

from groupwise import Trajectory, TrajectoryGroup
from groupwise.runs.step_summary import read_summary, summarize, summary_path
from groupwise.runs.store import RunStore, atomic_write_text, read_group_dicts, read_groups


def test_the_store_writes_a_summary_of_each_step_beside_its_file(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("train", 7, [group, group])
    assert summary_path(path) == path.parent / "0007.summary.json"
    summary = read_summary(path)
    assert summary == summarize(read_group_dicts(path))
    assert summary["groups"][0]["n"] == 2 and len(summary["trajectories"]) == 4
    assert summary["groups"][1] == {"scenario": 1, "prompt": "Board: 2 . . . . . . .", "n": 2, "metadata": {"scenario": 4},
                                    "exceptions": ["ValueError: rollout 3 failed"], "logs": ["judged by local/smollm2-135m"]}
    first = summary["trajectories"][0]
    assert (first["group"], first["index"], first["reward"]) == (0, 0, 0.75)
    assert first["metrics"] == {"max_tile": 64, "won": False, "moves": 12.5}
    # the search text has every message, the sampled turns' tool calls and the logs; no tokens
    text = first["text"]
    assert "move {\"direction\": \"left\"}" in text and "moved left" in text
    assert all(line.lower() in text for line in group.trajectories[0].logs) and text == text.lower()
    assert "logprob" not in json.dumps(summary)
    # the step file is what it always was: older readers see the same groups
    assert read_groups(path) == [group, group]


def test_a_summary_that_no_longer_describes_its_step_file_is_not_used(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("train", 0, [group, group])
    assert read_summary(path) is not None
    # code that writes no summary (an older version) rewrites the step: the old summary is stale
    atomic_write_text(path, path.read_text(encoding="utf-8").splitlines(keepends=True)[0])
    assert read_summary(path) is None
    # the store rewrites it (a resumed run redoes the step): a fresh summary again
    store.write_trajectories("train", 0, [group])
    assert len(read_summary(path)["trajectories"]) == 2
    # the same size but other bytes (one digit changed in place), at another time: refused by its digest
    text = path.read_text(encoding="utf-8")
    atomic_write_text(path, text.replace('"reward":0.75', '"reward":0.25', 1))
    assert path.stat().st_size == len(text.encode()) and read_summary(path) is None


def test_a_copied_run_keeps_its_summaries_and_a_missing_or_foreign_one_reads_as_none(tmp_path, group):
    store = RunStore(tmp_path / "a", "p", "m")
    path = store.write_trajectories("val", 2, [group])
    copy = tmp_path / "b" / "0002.jsonl"
    copy.parent.mkdir()
    shutil.copyfile(path, copy)  # new modification time, same bytes
    shutil.copyfile(summary_path(path), summary_path(copy))
    os.utime(copy, ns=(1, 1))
    assert read_summary(copy) == read_summary(path) is not None
    body = json.loads(summary_path(copy).read_text(encoding="utf-8"))
    summary_path(copy).write_text(json.dumps({**body, "version": 99}), encoding="utf-8")
    assert read_summary(copy) is None  # a format this reader does not know
    summary_path(copy).write_text("{not json", encoding="utf-8")
    assert read_summary(copy) is None
    summary_path(copy).unlink()
    assert read_summary(copy) is None  # a run written before summaries existed


def test_a_group_without_scenario_metadata_or_messages_is_summarised_by_position(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    g = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": [
        {"type": "text", "text": "Look at"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}], reward=1.0)])
    path = store.write_trajectories("train", 0, [TrajectoryGroup([]), g])
    summary = read_summary(path)
    none = {"exceptions": [], "logs": [], "metadata": {}}
    assert summary["groups"] == [{"scenario": 0, "prompt": "", "n": 0, **none},
                                 {"scenario": 1, "prompt": "Look at [image_url]", "n": 1, **none}]
    assert [(t["group"], t["answer"], t["text"]) for t in summary["trajectories"]] == [(1, "", "look at\n[image_url]")]  # lower case
