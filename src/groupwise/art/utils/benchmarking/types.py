"""Which run and split a benchmark chart shows, and under which name (`BenchmarkModelKey`, ART 0.3+),
and ART 0.1-0.2's records at this path (`BenchmarkedModelKey`, ...; `groupwise.utils.old_benchmarking`)."""

from __future__ import annotations

from groupwise.art.utils.old_benchmarking.types import BenchmarkedModel, BenchmarkedModelKey, BenchmarkedModelStep

__all__ = ["BenchmarkModelKey", "BenchmarkedModel", "BenchmarkedModelKey", "BenchmarkedModelStep"]


class BenchmarkModelKey:
    """A run's `name`, the name a chart shows it under (`display_name`, default `name`) and the split
    its rows come from (`split`, default ``"val"``)."""

    def __init__(self, name: str, display_name: str | None = None, split: str | None = None) -> None:
        self.name = name
        self.display_name = display_name or name
        self.split = split or "val"

    def __str__(self) -> str:
        return self.display_name

    def __repr__(self) -> str:
        return f"BenchmarkModelKey({self.name!r}, {self.display_name!r}, {self.split!r})"
