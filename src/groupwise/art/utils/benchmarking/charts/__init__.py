"""ART's benchmark charts (`art.utils.benchmarking.charts`), over `load_trajectories`' frame."""

from groupwise.art.utils.benchmarking.charts.percentage_comparison_bar_chart import percentage_comparison_bar_chart
from groupwise.art.utils.benchmarking.charts.training_progress_chart import training_progress_chart

__all__ = ["percentage_comparison_bar_chart", "training_progress_chart"]
