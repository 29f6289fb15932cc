"""A table of benchmarked steps: one row per run and step, one column per metric (pandas, as ART's)."""

from __future__ import annotations

from typing import Any

from groupwise.errors import MissingDependencyError
from groupwise.art.utils.old_benchmarking.load_benchmarked_models import load_benchmarked_models
from groupwise.art.utils.old_benchmarking.types import BenchmarkedModelKey
from groupwise.runs.output_dirs import ART_DEFAULT_PATH

__all__ = ["generate_comparison_table"]


def generate_comparison_table(project: str, benchmark_keys: list[BenchmarkedModelKey], metrics: list[str] | None = None,
                              api_path: str = ART_DEFAULT_PATH) -> Any:
    """A pandas DataFrame with columns Model, Split, Step (``0004``) and each metric (as text; "N/A"
    where a step has no value), as ART's."""
    try:
        import pandas as pd
    except ImportError as exc:
        raise MissingDependencyError("generate_comparison_table", "benchmarking", "pandas") from exc
    metrics = ["reward"] if metrics is None else list(metrics)
    rows = [{"Model": m.model_key.model, "Split": m.model_key.split, "Step": f"{step.index:04d}",
             **{metric: str(step.metrics.get(metric, "N/A")) for metric in metrics}}
            for m in load_benchmarked_models(project, benchmark_keys, metrics, api_path) for step in m.steps]
    return pd.DataFrame(rows, columns=pd.Index(["Model", "Split", "Step", *metrics]))
