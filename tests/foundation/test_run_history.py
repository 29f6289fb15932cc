"""RunHistory: a run's history in memory and the one writer of history.jsonl (groupwise/runs/history.py).

Appends cost one line whatever the run's length and never reread the file; the file is written on one
writer thread, in order; what memory holds is what the file holds; a change made behind its back is
seen."""

from __future__ import annotations

import asyncio
import threading

import pytest

import groupwise.runs.history as history_module
from groupwise import load_history
from groupwise.runs.history import RunHistory
from groupwise.runs.store import RunStore


def test_appends_write_one_line_each_and_read_the_file_once(tmp_path, reads):
    store = RunStore(tmp_path, "p", "m")
    store.append_history({"step": 0, "split": "val", "reward": 0.0})  # the file exists from here on
    history = store.run_history
    for step in range(60):
        store.append_history({"step": step, "split": "train", "reward": step / 100})
        assert history.rows("train")[-1]["step"] == step  # read back from memory, at once
    # 61 rows, 61 one-line appends, no rewrite, and the file was never read to append or to read
    assert (history.writes, history.rewrites, len(reads)) == (61, 0, 0)
    assert history.snapshot() == load_history(store.run_dir)
    assert len(reads) == 1  # (load_history's own read)


def test_a_replaced_row_rewrites_the_file_from_memory_and_keeps_foreign_lines(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    store.append_history({"step": 0, "split": "train", "reward": 0.1})
    with open(store.history_path, "a") as f:
        f.write('{"step": 1, "split": "val", oops}\n')  # whole but broken: a person's edit, not ours
    with pytest.warns(UserWarning, match=r"history.jsonl:2: skipped \(not valid JSON"):
        assert store.append_history({"step": 0, "split": "train", "reward": 0.2})  # seen, then replaced
    assert store.history_path.read_text().splitlines()[1] == '{"step": 1, "split": "val", oops}'
    assert [r["reward"] for r in store.run_history] == [0.2]
    assert store.run_history.rewrites == 1


def test_one_history_per_folder_and_a_change_behind_its_back_is_reread(tmp_path):
    a, b = RunStore(tmp_path, "p", "m"), RunStore(tmp_path, "p", "m")
    assert a.run_history is b.run_history  # the backend's store and the loop's store share it
    a.append_history({"step": 0, "split": "train"})
    a.append_history({"step": 1, "split": "train"})
    loads = a.run_history.loads
    lines = a.history_path.read_text().splitlines()
    a.history_path.write_text(lines[0] + "\n")  # a person truncates the file
    assert [r["step"] for r in a.run_history] == [0]
    assert a.run_history.loads == loads + 1
    fresh = RunHistory(a.run_dir)  # another process's view: the same rows
    assert fresh.snapshot() == a.run_history.snapshot()


async def test_async_writes_happen_on_the_writer_thread_in_order(tmp_path, monkeypatch):
    threads: list[str] = []
    real = history_module._append_line

    def spy(path, line):
        threads.append(threading.current_thread().name)
        return real(path, line)

    monkeypatch.setattr(history_module, "_append_line", spy)
    history = RunStore(tmp_path, "p", "m").run_history
    await asyncio.gather(*(history.write({"step": s, "split": "train"}) for s in range(50)))
    assert threads and all(name.startswith("groupwise-history") for name in threads)  # never the event loop
    assert [r["step"] for r in load_history(history.run_dir)] == list(range(50))  # the order they entered memory
    assert await history.write({"step": 3, "split": "train"}, if_missing=True) is False


def test_the_typed_views_read_what_the_series_readers_read(tmp_path):
    from groupwise.runs.curves import AlertRecord, Point
    from groupwise.runs.series import events, points
    from groupwise.loop.stopping import baseline_values

    store = RunStore(tmp_path, "p", "m")
    for step, reward in enumerate([0.1, 0.3, 0.2]):
        store.append_history({"step": step, "split": "train", "reward": reward, "reward_std": 0.2, "n_trajectories": 16})
    store.append_history({"step": 0, "split": "val", "accuracy": 0.5, "accuracy_lo": 0.3, "accuracy_hi": 0.7})
    store.append_history({"step": 2, "split": "val", "accuracy": 0.75})
    store.append_history({"step": 0, "split": "baseline", "name": "m@0", "kind": "base", "accuracy": 0.5,
                          "accuracy_lo": 0.3, "accuracy_hi": 0.7})
    store.append_history({"step": 2, "split": "alert", "name": "val_drop", "severity": "critical", "message": "fell",
                          "action": "stop", "evidence": {"drop": 0.2}})
    history, rows = store.run_history, load_history(store.run_dir)
    train = history.train_curve()
    assert train == points(rows, "train", "reward")
    half = 1.959964 * 0.2 / 4  # z(0.95) x std / sqrt(n)
    assert train[1].step == 1 and train[1].value == 0.3 and train[1].lo == pytest.approx(0.3 - half, abs=1e-6)
    assert history.validations("accuracy") == [Point(0, 0.5, 0.3, 0.7), Point(2, 0.75)]
    assert history.validations("accuracy", up_to=1) == points(rows, "val", "accuracy", up_to=1)
    assert history.baselines("accuracy") == {"m@0": Point(0, 0.5, 0.3, 0.7)}
    assert baseline_values(history, "accuracy") == baseline_values(rows, "accuracy") == {"m@0": 0.5}
    assert history.alerts() == [AlertRecord(2, "val_drop", "critical", "fell", "stop", {"drop": 0.2})]
    assert [AlertRecord.from_row(r) for r in events(rows, "alert")] == history.alerts()


def test_a_row_a_failed_write_left_out_is_not_kept_in_memory(tmp_path, monkeypatch):
    """A failed append was left in the mirror when another write queued behind it succeeded (that write's
    file signature matched, so nothing reloaded): the loop read a row the file never got."""
    import errno

    from groupwise.errors import RunFolderError

    h = RunHistory(tmp_path)
    h.append({"step": 0, "split": "train", "reward": 0.5})
    release = threading.Event()
    real = history_module._append_line

    def full_disk_once(path, line):
        if '"reward":1.5' in line:  # the disk fills on this row, while the next one waits behind it
            release.wait(10)
            raise history_module._unwritable(path, OSError(errno.ENOSPC, "No space left on device"))
        return real(path, line)

    monkeypatch.setattr(history_module, "_append_line", full_disk_once)
    _, failed = h._enter({"step": 1, "split": "train", "reward": 1.5}, False)
    _, written = h._enter({"step": 1, "split": "val", "accuracy": 0.25}, False)
    release.set()
    with pytest.raises(RunFolderError):
        failed.result(10)
    written.result(10)
    assert not h.has({"step": 1, "split": "train"})
    assert [(r["step"], r["split"]) for r in h] == [(0, "train"), (1, "val")]
    assert [(r["step"], r["split"]) for r in h] == [(r["step"], r["split"]) for r in load_history(tmp_path)]
    # the same row written again (the step redone, the disk freed) goes in
    monkeypatch.undo()
    assert h.append({"step": 1, "split": "train", "reward": 1.5})
    assert h.has({"step": 1, "split": "train"}) and len(load_history(tmp_path)) == 3
