"""The labelled sets judges are checked on (`groupwise judge eval`, `groupwise train --judge-labels`).

A labelled set is one of:
- an env with a labelled set of its own (``titles``: known-good and known-bad titles), judged with the
  env's rubric;
- a JSONL file (`evaluate.load_labelled`);
- a run folder: its validation trajectories, grouped by scenario across validation steps (answers of
  the same scenario by different checkpoints), labelled by the validation metric stored on each.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from groupwise.errors import ConfigError
from groupwise.judge.evaluate import LabelledGroup, labelled_from_groups, load_labelled

__all__ = ["labelled_from_run", "load_labels"]


def labelled_from_run(run_dir: str | Path, metric: str | None = None) -> list[LabelledGroup]:
    """A run's validation trajectories, grouped by scenario (their messages up to the first answer)
    across every validation step (`RunView.by_scenario`), labelled by ``metrics[metric]``; the metric
    defaults to the run's validation metric, as its report and dashboard name it (`RunView.val_metric`)."""
    from groupwise.runs.view import RunView

    run = RunView(run_dir)
    metric = metric or run.val_metric()
    if metric is None:
        raise ConfigError(f"{run_dir}: no validation rows with a metric; pass --metric", what="judge eval")
    return labelled_from_groups(run.by_scenario("val"), metric)


def load_labels(source: str, metric: str | None = None) -> tuple[list[LabelledGroup], str | None]:
    """(labelled groups, the rubric that goes with them or None) from an env name, a JSONL file or a run."""
    path = Path(source)
    if path.is_dir():
        return labelled_from_run(path, metric), None
    if path.is_file():
        return load_labelled(path), None
    if "/" not in source and "." not in source:
        try:
            module = importlib.import_module(f"groupwise.envs.{source}.labelled")
        except ModuleNotFoundError:
            pass
        else:
            return module.labelled_groups(), getattr(importlib.import_module(f"groupwise.envs.{source}"), "RUBRIC", None)
    raise ConfigError(f"--labels {source}: not a JSONL file, a run folder, or an env with a labelled set (titles)",
                      what="judge eval")
