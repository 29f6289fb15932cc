"""The real tier's runs kept as records: what the detectors read of a run, so that they can read it again.

A SmolLM2 run of bench/detectors.py costs minutes of a GPU; the detectors that judge it cost milliseconds.
A record holds what the loop's detectors see of a run — every step's training rollouts (answer text,
reward, task metric, by group) and every validation row — so `replay` runs today's detectors over runs
trained earlier, exactly as `gw.fit` runs them (hack_suite.through_detectors): a change to a detector is
measured on real runs without training them again, and a fresh clone tabulates the recorded runs in
seconds (`python bench/detectors.py --replay bench/data/detectors-smollm2-records.jsonl.gz`). Every alert
of those runs was set to 'warn', so no alert changed what the runs trained on: the replay is exact.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

META = "meta.json"  # beside a run's folders: kind, env, family, planted, seed (bench/detectors.py writes it)
ERROR = "error.txt"  # beside them: why the run ended early (a GroupwiseError), when it did


def record_of(run_dir: str | Path, **meta) -> dict:
    """A run folder's record: `meta`, its validation rows, and by step its training groups as
    [[answer, reward, task], ...] (a run stopped half-way keeps the steps it finished)."""
    import groupwise as gw
    from groupwise.runs.series import rows
    from groupwise.runs.step_summary import answer_text
    from groupwise.runs.store import read_groups, trajectory_files

    history = gw.load_history(run_dir)
    val = [{k: v for k, v in r.items() if k != "recorded_at"} for r in rows(history, "val")]
    steps = []
    for _, step, path in trajectory_files(run_dir, "train"):
        groups = [[[answer_text(t), float(t.reward), t.metrics.get("task")] for t in g.trajectories]
                  for g in read_groups(path, skip_corrupt=True) if g.trajectories]
        steps.append({"step": step, "groups": groups})
    return {**meta, "val_rows": val, "steps": sorted(steps, key=lambda s: s["step"])}


def collect(root: str | Path, out: str | Path) -> int:
    """Write the record of every run under `root` (bench/detectors.py's --path: runs/<name>/ with its
    META, the fit run folder inside) to `out` (.jsonl.gz); returns how many."""
    n = 0
    with gzip.open(out, "wt") as f:
        for meta_path in sorted(Path(root).glob(f"runs/*/{META}")):
            found = sorted(p.parent for p in meta_path.parent.rglob("history.jsonl"))
            if not found:
                continue
            error = meta_path.parent / ERROR
            meta = {**json.loads(meta_path.read_text()), "error": error.read_text() if error.is_file() else None}
            f.write(json.dumps(record_of(found[0], **meta)) + "\n")
            n += 1
    return n


def read_records(paths: list[str | Path]) -> list[dict]:
    out = []
    for path in paths:
        with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as f:
            out += [json.loads(line) for line in f if line.strip()]
    return out


def replay(record: dict, config) -> dict:
    """A record through today's detectors: the result dict of a run (bench/detectors.py's)."""
    import groupwise as gw
    import hack_suite as hs

    val = {int(r["step"]): r for r in record["val_rows"]}
    if 0 not in val:
        return {**_meta(record), "error": record.get("error") or "no base validation recorded", "alerts": {},
                "fired": {}, "val": {}, "val_ci": {}, "train": []}

    def steps():
        for s in record["steps"]:
            groups = [gw.TrajectoryGroup([
                gw.Trajectory(messages_and_choices=[{"role": "user", "content": f"group {gi}"},
                                                    {"role": "assistant", "content": text}],
                              reward=reward, metrics={} if task is None else {hs.METRIC: task})
                for text, reward, task in g]) for gi, g in enumerate(s["groups"])]
            after = val.get(s["step"] + 1)
            yield groups, (lambda row=after: row) if after is not None else None

    return {**_meta(record), "error": record.get("error"), **hs.through_detectors(val[0], steps(), config)}


def _meta(record: dict) -> dict:
    return {k: record.get(k) for k in ("kind", "env", "family", "planted", "seed", "steps_asked")}
