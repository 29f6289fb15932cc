"""ART's first benchmarking helpers (`art.utils.benchmarking` in ART 0.1-0.2, `art.utils.old_benchmarking`
since 0.3), over groupwise's run store: per-step metric means of stored trajectories
(`load_benchmarked_models`), a table of them (`generate_comparison_table`, pandas), line graphs saved as
PNG files (`generate_line_graphs`, matplotlib) and a notebook grid of those files (`display_image_grid`).
A run's trajectories are where its backend wrote them, ``<path>/<project>/models/<name>/trajectories/<split>/``;
ART's default ``api_path="./.art"`` reads groupwise's default store when no ``./.art`` folder exists.
"""

from groupwise.art.utils.old_benchmarking.calculate_step_metrics import calculate_step_std_dev
from groupwise.art.utils.old_benchmarking.display_image_grid import display_image_grid
from groupwise.art.utils.old_benchmarking.generate_comparison_table import generate_comparison_table
from groupwise.art.utils.old_benchmarking.generate_line_graphs import generate_line_graphs
from groupwise.art.utils.old_benchmarking.load_benchmarked_models import load_benchmarked_models
from groupwise.art.utils.old_benchmarking.types import BenchmarkedModel, BenchmarkedModelKey, BenchmarkedModelStep

__all__ = ["BenchmarkedModel", "BenchmarkedModelKey", "BenchmarkedModelStep", "calculate_step_std_dev",
           "display_image_grid", "generate_comparison_table", "generate_line_graphs", "load_benchmarked_models"]
