"""ART's `percentage_comparison_bar_chart`: a bar per run at its first step, with what training added
by its last step stacked on top and labelled."""

from __future__ import annotations

from typing import Any

from groupwise.art.utils.benchmarking.charts.series import pyplot, step_means
from groupwise.art.utils.benchmarking.types import BenchmarkModelKey

__all__ = ["percentage_comparison_bar_chart"]

_TRAINED, _PROMPTED, _LABEL = "#e67a30", "#e0dcd5", "#c05a20"


def percentage_comparison_bar_chart(df: Any, metric_name: str, models: list[str | BenchmarkModelKey] | None = None,
                                    title: str | None = None, y_label: str | None = None,
                                    perfect_score: float | None = None, num_decimals: int = 0) -> Any:
    """The matplotlib Figure. Values that all lie in [0, 1.01] are shown as percentages, as in ART;
    `y_label` is accepted and, as in ART, not drawn (the bars carry their values)."""
    plt = pyplot()
    _, means = step_means(df, metric_name, models)
    bars = [(m, points[0][1], points[-1][1] - points[0][1] if len(points) > 1 else 0.0) for m, points in means.items()]
    top = max(base + gain for _, base, gain in bars)
    scale, unit = (100.0, "%") if top <= 1.01 else (1.0, "")
    fig, ax = plt.subplots(figsize=(6, 4))
    for x, (model, base, gain) in enumerate(bars):
        base, gain = base * scale, gain * scale
        ax.bar(x, base, width=0.7, color=_TRAINED if gain else _PROMPTED, edgecolor="white")
        if gain:
            ax.bar(x, gain, width=0.7, bottom=base, color=_TRAINED, hatch="///", edgecolor="white", alpha=0.95)
            ax.text(x, base + gain / 2, f"RL {gain:+.{num_decimals}f}{unit}", ha="center", va="center", color=_LABEL,
                    fontweight="bold", bbox={"facecolor": "white", "boxstyle": "round,pad=0.3", "edgecolor": _TRAINED})
        ax.text(x, base + gain + top * scale * 0.02, f"{base + gain:.{num_decimals}f}{unit}", ha="center",
                va="bottom", fontweight="bold")
    if perfect_score is not None:
        ax.plot([-0.5, len(bars) - 0.5], [perfect_score * scale] * 2, color="dimgray", linewidth=1)
        ax.text(-0.4, perfect_score * scale - top * scale * 0.05, "Perfect score", va="top", ha="left", color="dimgray")
    ax.set_xticks(range(len(bars)), [m for m, _, _ in bars])
    ax.set_yticks([])
    ax.spines[["top", "right", "left"]].set_visible(False)
    ax.set_title(metric_name if title is None else title, pad=15)
    return fig
