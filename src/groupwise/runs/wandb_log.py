"""Each step's metrics sent to Weights & Biases as ART's `Model` sends them, when W&B is configured.

ART programs rely on W&B being fed while they run: they call ``model.update_wandb_config({...})``
before training, pass ``entity=``/``report_metrics=["wandb"]`` and look for the run in W&B by the
model's name. The run's own record stays ``history.jsonl`` (`groupwise.runs.history`); this module listens
to it and forwards every row as it is written, whoever writes it (``model.log``, a backend's train
step, an SFT step), so nothing is logged twice or missed.

ART's contract, kept here:

- **When.** ``report_metrics=None`` (the default): when ``WANDB_API_KEY`` is set (ART's test); here also
  when ``WANDB_MODE`` is ``offline``/``dryrun``, which needs no key. ``report_metrics=[...]``: when it
  names ``"wandb"`` and one of those holds (ART starts no run without the key either; one warning says
  so). A trainable model's run starts at ``register``, any model's at its first row.
- **Which run.** ``wandb.init(project=model.project, name=model.name, id=model.name, resume="allow")``
  (ART: a rerun of a model resumes its run), plus ``entity=model.entity`` when given (ART has the field;
  W&B's default entity otherwise). ``config`` is what ``update_wandb_config`` merged so far; later calls
  update the live run's config. A value already set cannot change (ART: "W&B config is immutable").
- **What.** One ``run.log`` per history row: its numbers, named ``<split>/<name>`` unless the name
  already starts with one of ART's sections or splits (``reward/``, ``loss/``, ``time/``, ``costs/``,
  ``train/``, ``val/``...), plus ``training_step`` (the x-axis of every section, so a validation of an
  earlier step lands at its step) and ``time/wall_clock_sec``.
- **Until when.** The run is finished by ``model.close()``, by ``backend.close()`` (the runs of every model
  registered on it) or at exit (W&B's own hook; ART never finishes it itself). Finishing it when the
  backend closes matters: while a run W&B started with ``reinit="create_new"`` is still open, a later
  ``wandb.init()`` of the user's (the next notebook cell, the next program run in one process) returns
  a run that is not ``wandb.run``, and its ``wandb.log`` / ``wandb.define_metric`` fail.

Without the ``wandb`` package, a program that asked for W&B gets one warning naming the history file
where its metrics are (and ``pip install wandb``); nothing else changes.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from groupwise.errors import ConfigError, GroupwiseWarning

# ART's metric sections and splits: a name that starts with one of them is logged under its own name
METRIC_SECTIONS = frozenset({"reward", "loss", "offpolicy", "pipeline", "throughput", "costs", "time", "data"})
METRIC_SPLITS = frozenset({"train", "val", "test"})
STEP_METRIC = "training_step"
_ROW_FIELDS = frozenset({"step", "split", "recorded_at"})
_OFFLINE_MODES = frozenset({"offline", "dryrun"})

_lock = threading.Lock()
_reporters: dict[str, "WandbReporter"] = {}  # run folder -> its reporter: one W&B run per run folder
_said: set[str] = set()


def wandb_wanted(report_metrics: list[str] | None) -> bool:
    """Whether this model's metrics go to W&B (module doc, "When")."""
    if report_metrics is not None:
        return "wandb" in report_metrics
    return "WANDB_API_KEY" in os.environ or os.environ.get("WANDB_MODE", "").lower() in _OFFLINE_MODES


def art_metric_names(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of one history row, named as ART's `Model` logs them (module doc, "What")."""
    split = str(row.get("split", "train"))
    out: dict[str, float] = {}
    for key, value in row.items():
        if key in _ROW_FIELDS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if isinstance(value, float) and math.isnan(value):
            continue  # ART drops NaN (a split with no trajectories has no mean)
        first, has_section = key.split("/", 1)[0], "/" in key
        named = key if has_section and (first in METRIC_SECTIONS or first in METRIC_SPLITS) else f"{split}/{key}"
        out[named] = value
    return out


def merge_config(existing: dict[str, Any], updates: dict[str, Any], path: str = "") -> dict[str, Any]:
    """`updates` merged into `existing`, nested dicts key by key; a key set to another value is refused."""
    merged = dict(existing)
    for key, value in updates.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in merged:
            merged[key] = value
        elif isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge_config(merged[key], value, where)
        elif merged[key] != value:
            raise ConfigError(f"W&B config is immutable once set (as in ART): {where!r} is {merged[key]!r}, "
                              f"asked for {value!r}; use another key", what="update_wandb_config")
    return merged


def say_once(key: str, message: str) -> None:
    with _lock:
        if key in _said:
            return
        _said.add(key)
    warnings.warn(GroupwiseWarning(message), stacklevel=3)


class WandbReporter:
    """The W&B run of one run folder, fed by that folder's `RunHistory` (a listener)."""

    def __init__(self, run_dir: Path, *, project: str, name: str, entity: str | None, config: dict[str, Any]) -> None:
        self.run_dir = run_dir
        self.project, self.name, self.entity = project, name, entity
        self.config = dict(config)
        self.run: Any = None
        self.started = time.time()
        self._lock = threading.Lock()
        self.failed = False

    def start(self) -> Any:
        """The W&B run, started on first use (resumed if one with the model's name exists)."""
        with self._lock:
            if self.run is not None or self.failed:
                return self.run
            import wandb

            try:
                run = wandb.init(project=self.project, name=self.name, id=_run_id(self.name), entity=self.entity,
                                 config=self.config or None, resume="allow", reinit="create_new")
            except Exception as err:  # a network or login failure must not stop training: say it once
                self.failed = True
                say_once(f"wandb-init:{self.run_dir}", f"W&B: could not start the run {self.name!r} of project "
                         f"{self.project!r} ({type(err).__name__}: {err}); this run's metrics are in "
                         f"{self.run_dir / 'history.jsonl'} (`groupwise report {self.run_dir} --wandb {self.project}` "
                         "sends them later)")
                return None
            run.define_metric(STEP_METRIC)
            run.define_metric("time/wall_clock_sec")
            for section in sorted(METRIC_SECTIONS | METRIC_SPLITS | {"discarded"}):
                run.define_metric(f"{section}/*", step_metric=STEP_METRIC)
            self.run = run
            return run

    def update_config(self, config: dict[str, Any]) -> None:
        with self._lock:
            self.config = merge_config(self.config, config)
            run, merged = self.run, self.config
        if run is not None:  # the merged config (as ART sends it): a nested key added to a section
            # changes that section's value, which W&B allows only when told (immutability is merge_config's)
            run.config.update(merged, allow_val_change=True)

    def __call__(self, row: dict[str, Any]) -> None:
        """A history row was written: log it."""
        metrics = art_metric_names(row)
        if not metrics and row.get("split") not in METRIC_SPLITS:
            return  # an alert or marker row: nothing to plot
        run = self.start()
        if run is None:
            return
        metrics[STEP_METRIC] = int(row["step"])
        metrics["time/wall_clock_sec"] = time.time() - self.started
        try:
            run.log(metrics)
        except Exception as err:
            say_once(f"wandb-log:{self.run_dir}", f"W&B: logging step {row['step']} failed ({type(err).__name__}: "
                     f"{err}); the metrics are in {self.run_dir / 'history.jsonl'}")

    def finish(self) -> None:
        with self._lock:
            run, self.run = self.run, None
        if run is not None:
            run.finish()


def _run_id(name: str) -> str:
    # W&B refuses ids with these characters; ART passes the name as it is (and fails on them)
    return "".join("-" if c in "/\\#?%:" else c for c in name)


def reporter_for(model: Any, *, start: bool = False) -> WandbReporter | None:
    """The reporter of `model`'s run folder, listening to its history, when W&B is wanted and installed
    (module doc); None otherwise, after saying once where the metrics are."""
    if not wandb_wanted(model.report_metrics):
        return None
    store = model.store
    history = store.run_history
    if "WANDB_API_KEY" not in os.environ and os.environ.get("WANDB_MODE", "").lower() not in _OFFLINE_MODES:
        # report_metrics=["wandb"] without a key: ART starts no run then either (and W&B would ask for a
        # login on a terminal, blocking the run)
        say_once(f"no-wandb-key:{store.run_dir}", "report_metrics=['wandb'] but WANDB_API_KEY is not set (ART "
                 "also logs to W&B only with it): set it, or WANDB_MODE=offline to write the W&B run locally; "
                 f"this run's metrics are in {history.path}")
        return None
    try:
        import wandb  # noqa: F401
    except ImportError:
        say_once(f"no-wandb:{store.run_dir}", "W&B reporting is asked for (WANDB_API_KEY / WANDB_MODE / "
                 "report_metrics=['wandb']) but the `wandb` package is not installed (pip install wandb): this "
                 f"run's metrics are in {history.path} (`groupwise report {store.run_dir}` plots them)")
        return None
    key = os.path.realpath(store.run_dir)
    with _lock:
        reporter = _reporters.get(key)
        if reporter is None:
            reporter = _reporters[key] = WandbReporter(Path(store.run_dir), project=model.project,
                                                      name=model.name, entity=model.entity,
                                                      config=model.wandb_config_so_far())
            history.add_listener(reporter)
    if start:
        reporter.start()
    return reporter


def finish(model: Any) -> None:
    """Finish the W&B run of `model`'s run folder, if one was started."""
    finish_store(model.store)


def finish_store(store: Any) -> None:
    """Finish the W&B run of a run store's folder, if one was started (a backend closing finishes the runs
    of the models registered on it)."""
    key = os.path.realpath(store.run_dir)
    with _lock:
        reporter = _reporters.pop(key, None)
    if reporter is not None:
        store.run_history.remove_listener(reporter)
        reporter.finish()
