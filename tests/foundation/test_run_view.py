"""`RunView` (groupwise/runs/view.py): one run folder read one way for every reader: compare, the judge's
labelled sets from a run, and the report and dashboard name the same metric and the same steps."""

from __future__ import annotations

import pytest

import groupwise as gw
from groupwise.errors import ConfigError, StoreError
from groupwise.runs.store import RunStore
from groupwise.runs.view import RunView


def _answer(q: str, a: str, acc: float) -> gw.TrajectoryGroup:
    return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": q},
                                                                   {"role": "assistant", "content": a}],
                                             reward=acc, metrics={"score": acc})])


@pytest.fixture
def run(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    for step, answers in ((0, [("2+2?", "5", 0.0), ("3+3?", "6", 1.0)]), (2, [("2+2?", "4", 1.0), ("3+3?", "7", 0.0)]),
                          (4, [("2+2?", "4", 1.0), ("3+3?", "6", 1.0)])):
        store.write_trajectories("val", step, [_answer(*a) for a in answers])
        acc = sum(a[2] for a in answers) / 2
        store.append_history({"step": step, "split": "val", "score": acc, "score_lo": 0.0, "score_hi": 1.0})
    store.write_trajectories("train", 1, [_answer("1+1?", "2", 1.0)])
    return store.run_dir


def test_a_run_read_through_the_view(run):
    view = RunView(run)
    assert [r["step"] for r in view.history] == [0, 2, 4]
    assert view.val_metric() == "score"  # the val rows' metric with an interval, as the report names it
    assert view.splits() == ["train", "val"] and view.steps("val") == [0, 2, 4] and view.steps("test") == []
    assert (view.step("best"), view.step("latest"), view.step("2")) == (4, 4, 2)
    assert [len(g.trajectories) for g in view.trajectories("val", 2)] == [1, 1]
    by_scenario = view.by_scenario("val")  # each prompt's answers across the validation steps, in step order
    assert [[t.messages()[-1]["content"] for t in g.trajectories] for g in by_scenario] == [["5", "4", "4"],
                                                                                           ["6", "7", "6"]]
    with pytest.raises(ConfigError, match="must be a number, 'best' or 'latest'"):
        view.step("first")
    with pytest.raises(StoreError, match="has no history.jsonl"):
        RunView(run.parent / "absent").history


def test_compare_and_the_judges_labels_read_the_run_as_the_view_does(run):
    from groupwise.judge.eval_command import labelled_from_run
    from groupwise.runs.compare import compare

    text = compare(run, "0,best", split="val", n=2, width=80)
    assert "val answers of step 0 (left) and step 4 (right)" in text
    groups = labelled_from_run(run)  # labelled by the view's metric, "score", without --metric
    assert [g.labels for g in groups] == [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]
    with pytest.raises(ConfigError, match="stores no test trajectories; pass --split with one it has: train, val"):
        compare(run, "0,best", split="test", n=1)
    # the old import path of compare is the same module
    import groupwise.loop.compare as old

    assert old.compare is compare


def test_a_run_watched_as_it_trains(tmp_path, run):
    """The dashboard's view (`watch`): a folder a job has just taken has no rows yet rather than an error,
    who holds the writer lock is seen without taking it, and corrupt lines are skipped without a warning;
    the CLI's view warns of each one."""
    import math
    import os
    import warnings

    from groupwise.runs.lock import RunLock
    from groupwise.runs.view import find_runs, is_run_dir

    fresh = tmp_path / "p" / "models" / "loading"
    lock = RunLock(fresh).acquire()
    try:
        view = RunView(fresh, watch=True)
        assert view.history == [] and view.history_age() == math.inf and view.lock_taken()
        # the holder as /proc/locks names it (this process); a system without /proc shows none
        assert view.writer_pid() == (os.getpid() if os.path.exists("/proc/locks") else None)
        assert is_run_dir(fresh) and find_runs(tmp_path) == sorted([fresh, run])
    finally:
        lock.release()
    assert RunView(fresh, watch=True).writer_pid() is None and RunView(fresh, watch=True).lock_taken()
    assert not RunView(run).lock_taken() and math.isfinite(RunView(run).history_age())
    with open(run / "history.jsonl", "a", encoding="utf-8") as f:
        f.write("not json\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(RunView(run, watch=True).history) == 3
        assert not caught
        assert len(RunView(run).history) == 3
        assert any("history.jsonl" in str(w.message) for w in caught)
