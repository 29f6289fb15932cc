"""bench/train_step.py's `device_gaps`, on a synthetic Chrome trace: where a profiled update's device waited for
the host, and which CPU ops of the launching thread ran when each gap began. Nothing is profiled here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "src"))

from train_step import device_gaps  # noqa: E402


def test_gaps_are_summed_ranked_and_named_by_the_launching_threads_ops(tmp_path):
    us = 1.0  # trace times are in microseconds
    events = [
        # kernels: 0-100 and 50-150 overlap (busy 150), then 1,150-1,200 and 1,700-1,750
        {"cat": "kernel", "ts": 0 * us, "dur": 100 * us}, {"cat": "kernel", "ts": 50 * us, "dur": 100 * us},
        {"cat": "kernel", "ts": 1150 * us, "dur": 50 * us}, {"cat": "gpu_memcpy", "ts": 1700 * us, "dur": 50 * us},
        # the launching thread (most runtime calls) ran `read back` during the first gap, `optimizer` during the second
        {"cat": "cuda_runtime", "tid": 1, "ts": 0}, {"cat": "cuda_runtime", "tid": 1, "ts": 1100},
        {"cat": "cuda_runtime", "tid": 2, "ts": 5},
        {"cat": "cpu_op", "tid": 1, "name": "update", "ts": 0, "dur": 2000},
        {"cat": "cpu_op", "tid": 1, "name": "read back", "ts": 140, "dur": 900},
        {"cat": "cpu_op", "tid": 1, "name": "optimizer", "ts": 1190, "dur": 400},
        {"cat": "cpu_op", "tid": 2, "name": "another thread", "ts": 0, "dur": 2000},
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    lines = device_gaps(str(path)).splitlines()
    assert lines[0] == ("device gaps: kernels busy 0.2 ms of 1.8 ms from first to last kernel; "
                        "2 gaps >= 0.2 ms sum 1.5 ms")
    assert lines[1].strip() == "1.00 ms at +    0.15 ms: update > read back"
    assert lines[2].strip() == "0.50 ms at +    1.20 ms: update > optimizer"


def test_a_trace_without_kernels_says_so(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"cat": "cpu_op", "tid": 1, "name": "x", "ts": 0, "dur": 1}]}))
    assert device_gaps(str(path)) == "device gaps: no kernels in the trace"
