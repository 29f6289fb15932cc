"""Line graphs of benchmarked metrics over steps (or time), one PNG per metric (matplotlib, as ART's)."""

from __future__ import annotations

import math
import os
from datetime import datetime
from typing import Literal

from groupwise.errors import ConfigError, MissingDependencyError
from groupwise.art.utils.old_benchmarking.load_benchmarked_models import load_benchmarked_models
from groupwise.art.utils.old_benchmarking.types import BenchmarkedModelKey
from groupwise.runs.output_dirs import ART_DEFAULT_PATH, art_path_or_default

__all__ = ["generate_line_graphs"]


def generate_line_graphs(project: str, line_graph_keys: list[BenchmarkedModelKey],
                         comparison_keys: list[BenchmarkedModelKey], metrics: list[str] | None = None,
                         x_axis_metric: Literal["step", "time"] = "step", api_path: str = ART_DEFAULT_PATH) -> list[str]:
    """Draw each metric of `line_graph_keys` over their steps (or the times their steps were recorded),
    with each of `comparison_keys` as a dashed line at its last step's value; save one PNG per metric
    under ``<store>/<project>/benchmarks/`` and return their paths. With ``x_axis_metric="time"`` a run
    whose steps lack a recorded time is left out, with a printed warning (as ART does)."""
    if x_axis_metric not in ("step", "time"):
        raise ConfigError([f"x_axis_metric must be 'step' or 'time', not {x_axis_metric!r}"], what="line graphs")
    try:
        import matplotlib.dates as mdates
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingDependencyError("generate_line_graphs", "plots", "matplotlib") from exc
    metrics = ["reward"] if metrics is None else list(metrics)
    out_dir = os.path.join(art_path_or_default(api_path), project, "benchmarks")
    os.makedirs(out_dir, exist_ok=True)
    lines = load_benchmarked_models(project, line_graph_keys, metrics, api_path)
    if x_axis_metric == "time":
        for model in [m for m in lines if any(s.recorded_at is None for s in m.steps)]:
            print(f"WARNING: {model.model_key} has a step without a recorded time; left out of the line graphs")
        lines = [m for m in lines if all(s.recorded_at is not None for s in m.steps)]
    comparisons = load_benchmarked_models(project, comparison_keys, metrics, api_path)
    paths = []
    for metric in metrics:
        fig, ax = plt.subplots()
        last_x = 0.0
        for model in lines:
            xs = [float(mdates.date2num(s.recorded_at)) if x_axis_metric == "time" else float(s.index)
                  for s in model.steps]
            ys = [s.metrics.get(metric, math.nan) for s in model.steps]
            ax.plot(xs, ys, label=f"{model.model_key.model} {model.model_key.split}")
            if xs:
                ax.scatter(xs[-1], ys[-1], s=10)
                last_x = xs[-1]
        for model in comparisons:
            value = model.steps[-1].metrics.get(metric, math.nan) if model.steps else math.nan
            ax.axhline(y=value, color="black", linestyle="--")
            ax.text(last_x, value, f"{model.model_key.model} {model.model_key.split}", ha="right", va="bottom",
                    fontsize=8, color="black")
        ax.set_title(metric)
        ax.set_xlabel(x_axis_metric)
        ax.set_ylabel(metric)
        if lines:
            ax.legend()
        ax.grid(axis="y", color="lightgray", linestyle="--", linewidth=0.25)
        path = os.path.join(out_dir, f"{datetime.now().strftime('%Y-%m-%d_%H:%M:%S.%f')[:-3]}_{metric}_line_graph.png")
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
