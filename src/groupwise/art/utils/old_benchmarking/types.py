"""The records of ART's first benchmarking helpers: which run, split and steps to read
(`BenchmarkedModelKey`), and what was read (a `BenchmarkedModel` of `BenchmarkedModelStep`s)."""

from __future__ import annotations

from datetime import datetime

__all__ = ["BenchmarkedModel", "BenchmarkedModelKey", "BenchmarkedModelStep"]


class BenchmarkedModelKey:
    """A run (`model`, its name), one `split`, and the steps to read: every stored step when
    `step_indices` is None; a negative index i reads step ``i - 1 + last`` (last: the last stored
    step), ART's arithmetic, kept so that a ported program reads the steps it read under ART."""

    def __init__(self, model: str, split: str, step_indices: list[int] | None = None) -> None:
        self.model = model
        self.split = split
        self.step_indices = step_indices

    def __str__(self) -> str:
        steps = self.step_indices or []
        span = "" if not steps else str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
        return f"{self.model} {self.split} {span}"

    def __repr__(self) -> str:
        return f"BenchmarkedModelKey({self.model!r}, {self.split!r}, {self.step_indices!r})"


class BenchmarkedModelStep:
    """One step's metric means (`metrics`) and when its history row was written (`recorded_at`)."""

    def __init__(self, index: int, metrics: dict[str, float] | None = None) -> None:
        self.index = index
        self.metrics: dict[str, float] = dict(metrics or {})
        self.recorded_at: datetime | None = None

    def __str__(self) -> str:
        return f"{self.index} {self.metrics}"


class BenchmarkedModel:
    """A key and the steps read for it, in the key's order."""

    def __init__(self, model_key: BenchmarkedModelKey, steps: list[BenchmarkedModelStep] | None = None) -> None:
        self.model_key = model_key
        self.steps: list[BenchmarkedModelStep] = list(steps or [])

    def __str__(self) -> str:
        return "\n".join([str(self.model_key), *map(str, self.steps)])
