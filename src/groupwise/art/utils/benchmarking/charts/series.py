"""What both benchmark charts read from a `load_trajectories` frame: the metric's column, the runs to
draw in their order, and each run's per-step mean."""

from __future__ import annotations

import math
from typing import Any

from groupwise.errors import ConfigError, MissingDependencyError
from groupwise.art.utils.benchmarking.filter_model_split import filter_rename_model_split
from groupwise.art.utils.benchmarking.types import BenchmarkModelKey

__all__ = ["metric_column", "pyplot", "step_means"]


def pyplot() -> Any:
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("the benchmark charts", "plots", "matplotlib") from exc
    return plt


def metric_column(df: Any, metric_name: str) -> str:
    """`metric_name` if the frame has that column, else ``metric_<metric_name>``; a `ConfigError` listing
    the metric columns when neither exists."""
    column = metric_name if metric_name in df.columns else f"metric_{metric_name}"
    if column not in df.columns:
        known = [c for c in df.columns if c.startswith("metric_") or c == "reward"]
        raise ConfigError([f"no column {column!r} in the frame; its metrics: {known}"], what="benchmark chart")
    return column


def step_means(df: Any, metric_name: str, models: list[str | BenchmarkModelKey] | None
               ) -> tuple[str, dict[str, list[tuple[int, float]]]]:
    """(column, {run shown: [(step, mean of the column), ...] by step}), the runs in drawing order: the
    order of `models` (names or `BenchmarkModelKey`s, their rows renamed to display names), else the
    trained runs (several steps), then the prompted ones (one step), each alphabetically."""
    column = metric_column(df, metric_name)
    if models is not None:
        keys = [m if isinstance(m, BenchmarkModelKey) else BenchmarkModelKey(m) for m in models]
        df = filter_rename_model_split(df, keys)
        order = list(dict.fromkeys(k.display_name for k in keys))
    else:
        order = sorted(set(df["model"].to_list()))
    if df.is_empty():
        raise ConfigError(["no rows left for the chosen models and splits; check their names and split "
                           "(BenchmarkModelKey's split is 'val' unless given)"], what="benchmark chart")
    sums: dict[str, dict[int, list[float]]] = {}
    for model, step, value in zip(df["model"].to_list(), df["step"].to_list(), df[column].to_list()):
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            sums.setdefault(model, {}).setdefault(step, []).append(float(value))
    means = {m: [(s, sum(v) / len(v)) for s, v in sorted(sums[m].items())] for m in order if m in sums}
    if models is None:
        means = {m: means[m] for m in sorted(means, key=lambda m: len(means[m]) == 1)}
    return column, means
