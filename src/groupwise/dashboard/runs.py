"""The dashboard's run-level readers: which runs a folder holds, each run's state and summary, its curves.

Everything here is read through the run-reading view the CLI's readers use (`groupwise.runs.view`: the
history, the writer lock's holder, `groupwise.runs.series`' curves and validation metric); nothing here
writes into a run folder or takes its lock, so watching a run can never disturb the process that trains it.

A run's state:

- ``training``: a process holds the run's writer lock (`RunView.writer_pid`). The lock is seen in
  ``/proc/locks`` rather than by trying to take it: a reader that held the lock even for a moment could
  make a starting `groupwise train` fail with `RunLockedError`. Where no lock is visible (a backend that
  takes none, or no /proc), a history written in the last `ACTIVE_WITHIN_S` seconds counts as training.
- ``stopped``: the loop logged its stop decision (the rule and reason are shown).
- ``crashed``: neither: the history ends without a stop decision and nobody writes it any more.
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from groupwise.errors import GroupwiseError
from groupwise.loop.detectors import alert_kind
from groupwise.runs.series import Row, events, interval, latest_step, points, rows, val_metric_name, value
from groupwise.runs.view import RunView, is_run_dir, load_history

# A run without a visible writer lock still counts as training while its history moved this recently.
ACTIVE_WITHIN_S = 120.0
# Fields of a train row that are bookkeeping, not curves.
_NOT_CURVES = {"step", "split", "recorded_at", "n_groups", "n_trajectories", "n_exceptions", "name", "kind",
               "message", "severity", "action", "rule", "reason", "evidence", "scenarios", "best_metric"}
# Alerts about validation (val_*, and the judge's check on judged validation groups); the others are about
# the train groups sampled at the alert's step (`groupwise.loop.detectors.run_detectors` dates them so).
_VAL_ALERTS = ("val_", "judge_disagreement")


def run_id(root: Path, run_dir: Path) -> str:
    rel = run_dir.relative_to(root).as_posix()
    return rel or "."


def resolve_run(root: Path, run: str) -> Path:
    """The run folder that `run` (an id from `find_runs`) names; refuses a path outside `root`, and text
    no folder can be named by (a NUL byte, a name longer than the system allows, a loop of links)."""
    shown = run if len(run) <= 200 else f"{run[:200]}... ({len(run)} characters)"
    refused = GroupwiseError(f"no run {shown!r} under {root} (the runs list names them; parameter run)")
    try:
        path = (root / run).resolve()
        if not path.is_relative_to(root.resolve()) or not is_run_dir(path):
            raise refused
    except (OSError, ValueError):  # ValueError: an embedded NUL; OSError: a name too long, a link loop
        raise refused from None
    return path


def history_of(run_dir: Path) -> list[Row]:
    """The run's history rows, as `RunView(run_dir, watch=True).history` reads them: corrupt lines are
    skipped without a warning (a dashboard shows what it can read; `warnings.catch_warnings` would change
    every request thread's filters)."""
    return load_history(run_dir, skip_corrupt=True, warn=False)


def _minutes(history: list[Row], now: float | None) -> float | None:
    stamps = []
    for row in history:
        at = row.get("recorded_at")
        if isinstance(at, str):
            try:
                stamps.append(datetime.fromisoformat(at).timestamp())
            except ValueError:
                continue
    if not stamps:
        return None
    end = now if now is not None else max(stamps)
    return max(0.0, end - min(stamps)) / 60.0


def _point(row: Row | None, metric: str | None, split: str = "val") -> dict[str, Any] | None:
    if row is None or metric is None:
        return None
    v = value(row, split, metric)
    if v is None:
        return None
    ci = interval(row, split, metric)
    return {"step": row.get("step"), "value": v, "lo": ci[0] if ci else None, "hi": ci[1] if ci else None}


def run_state(run_dir: Path, history: list[Row]) -> dict[str, Any]:
    """{'state': training | stopped | crashed | empty, 'detail': why}."""
    view = RunView(run_dir, watch=True)
    pid = view.writer_pid()
    if pid is not None:
        waiting = "" if history else "; nothing written yet (loading the model, validating the base)"
        return {"state": "training", "detail": f"pid {pid} holds the writer lock{waiting}"}
    stops = events(history, "stop")
    last_train = max((r["step"] for r in rows(history, "train")), default=-1)
    if stops and stops[-1]["step"] >= last_train:
        s = stops[-1]
        return {"state": "stopped", "detail": f"{s.get('rule', '?')}: {s.get('reason', '')}".strip(": "),
                "rule": s.get("rule")}
    age = view.history_age()
    if age <= ACTIVE_WITHIN_S:
        return {"state": "training", "detail": f"history written {age:.0f} s ago"}
    if not history:
        taken = view.lock_taken()  # a job took the folder, and ended before its first row
        return {"state": "empty", "detail": "the job that took this folder ended before writing a step (its "
                                            "output says why)" if taken else "no history written"}
    return {"state": "crashed", "detail": f"no stop decision, and nothing written for {age / 60:.0f} min"}


def run_summary(root: Path, run_dir: Path) -> dict[str, Any]:
    """One line of the runs list: state, steps, best step, base vs best validation, time, step rate."""
    history = history_of(run_dir)
    state = run_state(run_dir, history)
    metric = val_metric_name(history)
    vals = {r["step"]: r for r in rows(history, "val")}
    base_rows = [r for r in events(history, "baseline") if r.get("kind") == "base"] or events(history, "baseline")[:1]
    base = _point(base_rows[0], metric) if base_rows else _point(vals.get(0), metric)
    stops = events(history, "stop")
    best_step = stops[-1].get("best_step") if stops else None
    if not isinstance(best_step, int):
        scored = [p for p in points(history, "val", metric)] if metric else []
        best_step = max(scored, key=lambda p: (p.value, p.step)).step if scored else None
    minutes = _minutes(history, time.time() if state["state"] == "training" else None)
    n_steps = len(rows(history, "train"))
    return {
        "id": run_id(root, run_dir), "project": run_dir.parent.name, "model": run_dir.name, **state,
        "latest_step": latest_step(history) if n_steps else None, "train_steps": n_steps, "metric": metric,
        "best_step": best_step, "base": base, "best": _point(vals.get(best_step), metric) if best_step is not None else None,
        "minutes": minutes, "steps_per_min": n_steps / minutes if minutes else None,
        "alerts": len(events(history, "alert")), "rows": len(history),
    }


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:  # an integer past float's range (a hand-edited or old history)
        return None
    return v if math.isfinite(v) else None


def _columns(rs: list[Row], keys: list[str], split: str) -> dict[str, list[float | None]]:
    return {k: [value(r, split, k) for r in rs] for k in keys}


def curves(run_dir: Path) -> dict[str, Any]:
    """Every curve of the run's history, as columns uPlot draws: train reward with its spread, validation
    with its interval, baselines, the trainer's metrics, seconds per phase, alerts and the stop. (The
    judge's agreement is read from the trajectories: `groupwise.dashboard.rollouts.judge_agreement`.)"""
    history = history_of(run_dir)
    metric = val_metric_name(history)
    train = rows(history, "train")
    t_steps = [r["step"] for r in train]
    reward = [value(r, "train", "reward") for r in train]
    spread = [value(r, "train", "reward_std") or 0.0 for r in train]
    val = points(history, "val", metric) if metric else []
    metric_keys = sorted({k for r in train for k, v in r.items()
                          if k not in _NOT_CURVES and k not in ("reward", "reward_std") and _finite(v) is not None})
    loop = {r["step"]: r for r in rows(history, "loop")}
    for r in rows(history, "val"):
        loop.setdefault(r["step"], {})
    phase_steps = sorted(loop)
    val_time = {r["step"]: value(r, "val", "time/val_s") for r in rows(history, "val")}
    phases = {"step": phase_steps}
    for key in ("time/gather_s", "time/reward_s", "time/train_s"):
        phases[key.split("/")[1]] = [_finite(loop[s].get(key)) for s in phase_steps]
    phases["val_s"] = [val_time.get(s) for s in phase_steps]
    cost = [_finite(loop[s].get("judge/cost_usd")) for s in phase_steps]
    baselines = [{"name": str(b.get("name")), "kind": b.get("kind"), **(_point(b, metric) or {})}
                 for b in events(history, "baseline")] if metric else []
    alerts = []
    for a in events(history, "alert"):
        split = "val" if str(a.get("name", "")).startswith(_VAL_ALERTS) else "train"
        ev = a.get("evidence") if isinstance(a.get("evidence"), dict) else {}
        group = ev.get("worst_group", ev.get("group"))
        # a rollout-signal alert is raised after its step trained: its evidence names the step that sampled them
        at = ev.get("val_step", a["step"]) if split == "val" else ev.get("train_step", a["step"])
        alerts.append({"step": a["step"], "name": a.get("name"), "severity": a.get("severity", "warning"),
                       "kind": a.get("kind") or alert_kind(str(a.get("name", ""))),
                       "message": a.get("message", ""), "action": a.get("action"), "evidence": ev,
                       "link": {"split": split, "step": at if isinstance(at, int) else a["step"],
                                "group": group if isinstance(group, int) else None}})
    stop = events(history, "stop")[-1] if events(history, "stop") else None
    return {
        "metric": metric,
        "train": {"step": t_steps, "reward": reward, "lo": [None if m is None else m - s for m, s in zip(reward, spread)],
                  "hi": [None if m is None else m + s for m, s in zip(reward, spread)], "std": spread},
        "val": {"step": [p.step for p in val], "value": [p.value for p in val],
                "lo": [p.lo for p in val], "hi": [p.hi for p in val]},
        "baselines": baselines,
        "metrics": {"step": t_steps, **_columns(train, metric_keys, "train")},
        "phases": phases, "judge_cost_usd": cost,
        "alerts": alerts,
        "stop": None if stop is None else {k: stop.get(k) for k in ("step", "rule", "reason", "best_step", "best_metric")},
    }


def dumps(obj: Any, *, ascii_only: bool = False) -> str:
    """JSON for the page: NaN and infinities (a store keeps them) become null, which JSON can carry."""
    def clean(o: Any) -> Any:
        if isinstance(o, float):
            return o if math.isfinite(o) else None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o

    return json.dumps(clean(obj), ensure_ascii=ascii_only, separators=(",", ":"))


def json_bytes(obj: Any) -> bytes:
    """`dumps` as the UTF-8 bytes of an answer. A stored text may hold a lone surrogate (the store keeps
    what a rollout wrote: JSON escapes it), which UTF-8 cannot carry: such a body is sent with every
    non-ASCII character escaped (``\\ud800``), which JSON.parse reads back as the same text."""
    try:
        return dumps(obj).encode("utf-8")
    except UnicodeEncodeError:
        return dumps(obj, ascii_only=True).encode("ascii")
