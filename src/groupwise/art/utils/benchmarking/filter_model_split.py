"""Keep the rows of chosen runs and splits, renamed to their display names (ART's chart input)."""

from __future__ import annotations

from typing import Any

from groupwise.art.utils.benchmarking.types import BenchmarkModelKey

__all__ = ["filter_rename_model_split"]


def filter_rename_model_split(df: Any, models: list[BenchmarkModelKey]) -> Any:
    """The rows of `df` (from `load_trajectories`) whose (model, split) is one of `models`' (name,
    split), with ``model`` set to that key's `display_name`."""
    import polars as pl

    if not models:
        return df.clear()
    chosen = [(pl.col("model") == key.name) & (pl.col("split") == key.split) for key in models]
    df = df.filter(pl.any_horizontal(chosen))
    renamed = pl.col("model")
    for key, condition in zip(models, chosen):
        if key.display_name != key.name:
            renamed = pl.when(condition).then(pl.lit(key.display_name)).otherwise(renamed)
    return df.with_columns(renamed.alias("model"))
