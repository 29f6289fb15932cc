"""The dashboard reads damaged run files without warning about each skipped line, and without touching the
process's warning filters: `warnings.catch_warnings` saves and restores the filters of the whole process,
so two request threads inside it at once left GroupwiseWarning ignored for good (the one restoring last
restored the other's "ignore")."""

from __future__ import annotations

import threading
import warnings

import groupwise.dashboard.runs as runs
from groupwise.errors import GroupwiseWarning


def test_concurrent_reads_leave_the_warning_filters_as_they_were(tmp_path, monkeypatch):
    run = tmp_path / "p" / "r"
    run.mkdir(parents=True)
    (run / "history.jsonl").write_text('{"step": 0, "split": "train", "reward": 1}\nnot json\n')
    both_in, first_out = threading.Barrier(2, timeout=10), threading.Event()
    real = runs.load_history
    order = iter(["first", "second"])
    lock = threading.Lock()

    def interleaved(*args, **kwargs):
        with lock:
            me = next(order)
        rows = real(*args, **kwargs)
        both_in.wait()  # both requests are inside the reader at once
        if me == "second":
            first_out.wait(10)  # and the second leaves after the first
        return rows

    monkeypatch.setattr(runs, "load_history", interleaved)
    before = list(warnings.filters)
    results: dict[str, object] = {}

    def request(name):
        results[name] = runs.history_of(run)
        first_out.set()  # whichever request returns first lets the other return

    threads = [threading.Thread(target=request, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert [len(r) for r in results.values()] == [1, 1]  # the sound row, the corrupt line skipped
    assert warnings.filters == before
    with warnings.catch_warnings(record=True) as caught:  # a groupwise warning is still shown afterwards
        warnings.simplefilter("default")
        warnings.warn("still shown", GroupwiseWarning)
    assert [str(w.message) for w in caught] == ["still shown"]
