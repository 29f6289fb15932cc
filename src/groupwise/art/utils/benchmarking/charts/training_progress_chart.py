"""ART's `training_progress_chart`: a metric over training steps, a line per trained run and a
horizontal line per prompted model (one step)."""

from __future__ import annotations

from typing import Any

from groupwise.art.utils.benchmarking.charts.series import pyplot, step_means
from groupwise.art.utils.benchmarking.types import BenchmarkModelKey

__all__ = ["training_progress_chart"]


def training_progress_chart(df: Any, metric_name: str, models: list[str | BenchmarkModelKey] | None = None,
                            title: str | None = None, x_label: str | None = None, y_label: str | None = None,
                            perfect_score: float | None = None, legend_loc: str | None = "lower right") -> Any:
    """The matplotlib Figure: each run's per-step mean of `metric_name` (a ``metric_`` column of `df`
    or a column by its name); runs with one step drawn as dashed (dotted where a second has the same
    value) lines across the steps; `perfect_score` as a grey reference line."""
    plt = pyplot()
    _, means = step_means(df, metric_name, models)
    steps = [s for points in means.values() for s, _ in points]
    low, high = min(steps), max(steps)
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    trained = [m for m, points in means.items() if len(points) > 1]
    prompted = [m for m, points in means.items() if len(points) == 1]
    color = {m: colors[i % len(colors)] for i, m in enumerate(trained + prompted)}
    if perfect_score is not None:
        ax.plot([low, high], [perfect_score, perfect_score], color="dimgray", linewidth=1, label="_nolegend_")
        ax.annotate("Perfect score", (low, perfect_score), xytext=(2, -4), textcoords="offset points",
                    va="top", color="dimgray")
    seen: set[float] = set()
    for model in prompted:  # drawn first, so the trained runs' lines are on top
        value = means[model][0][1]
        ax.plot([low, high], [value, value], linestyle=":" if value in seen else "--", linewidth=2,
                color=color[model], label=model)
        seen.add(value)
    for model in trained:
        ax.plot([s for s, _ in means[model]], [v for _, v in means[model]], marker="o", linewidth=2,
                color=color[model], label=model)
    ax.set_title(metric_name if title is None else title)
    ax.set_xlabel("Step" if x_label is None else x_label)
    if y_label is not None:
        ax.set_ylabel(y_label)
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    ax.legend([handles[m] for m in trained + prompted], trained + prompted, loc=legend_loc, frameon=True)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout(pad=1.0)
    return fig
