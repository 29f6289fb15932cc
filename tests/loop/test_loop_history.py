"""The loop reads the run's history from memory and writes each row once, off the event loop.

Before, every step reparsed history.jsonl several times (quadratic over a run) and appended to it
synchronously inside the event loop."""

from __future__ import annotations

import threading

import pytest
from loop_helpers import run_scripted

import groupwise as gw
import groupwise.runs.history as history_module
from groupwise.runs.history import RunHistory


@pytest.mark.parametrize("steps", [4, 12])
async def test_a_run_reads_its_history_file_at_most_once_whatever_its_length(tmp_path, reads, steps):
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=steps, patience=100,
                           num_epochs=10)
    summary, _ = await run_scripted(str(tmp_path), config=config)
    assert summary.final_step == steps
    assert len(reads) <= 1  # (a fresh run has no file to read at its start)


async def test_every_history_write_of_a_run_is_one_line_on_the_writer_thread(tmp_path, monkeypatch):
    threads: list[str] = []
    real = history_module._append_line

    def spy(path, line):
        threads.append(threading.current_thread().name)
        return real(path, line)

    monkeypatch.setattr(history_module, "_append_line", spy)
    summary, _ = await run_scripted(str(tmp_path))
    rows = gw.load_history(summary.run_dir)
    assert len(threads) == len(rows)  # each row written once: none replaced, none rewritten
    assert all(name.startswith("groupwise-history") for name in threads)  # the event loop never waits on disk


async def test_a_resumed_run_continues_the_history_the_file_holds(tmp_path):
    short = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, eval_every=2, max_steps=3, patience=100,
                          num_epochs=2)
    memory = RunHistory.of(tmp_path / "loop" / "models" / "scripted")  # the runs' own, held to look at after them
    first, _ = await run_scripted(str(tmp_path), config=short)
    summary, _ = await run_scripted(str(tmp_path))  # max_steps=6: resumes at step 3
    assert (first.final_step, summary.start_step, summary.final_step) == (3, 3, 6)
    on_disk = gw.load_history(summary.run_dir)
    assert memory.snapshot() == on_disk and memory.loads == 0  # memory is the file, never read back
    assert RunHistory(summary.run_dir).snapshot() == on_disk  # and a fresh reader sees the same
    assert [(r["step"], r["split"]) for r in on_disk if r["split"] in ("train", "val", "stop")] == [
        (0, "val"), (0, "train"), (1, "train"), (2, "val"), (2, "train"), (3, "val"), (3, "stop"),
        (3, "train"), (4, "val"), (4, "train"), (5, "train"), (6, "val"), (6, "stop")]
