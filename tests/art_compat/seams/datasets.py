"""Stand-in for Hugging Face `datasets` in ART's programs, whose data sets live on the Hugging Face hub
(no network here): `load_dataset(repo_id, split=...)` answers with the rows the test registered in
`HUB[(repo_id, split)]` (shrunk rows in the hub data set's own columns and Python types, datetimes
included, as `datasets` returns them). `Dataset` keeps the part of its interface ART's programs use:
`filter`, `map` (the returned columns are merged into each row), `select`, `shuffle`, `len`, iteration
and indexing. The schema classes (`Features`, `Value`, `Sequence`) are accepted and not checked."""

from __future__ import annotations

import random
from typing import Any, Callable, Iterable

HUB: dict[tuple[str, str], list[dict]] = {}


class Dataset:
    def __init__(self, rows: Iterable[dict]) -> None:
        self._rows = [dict(row) for row in rows]

    @classmethod
    def from_list(cls, rows: list[dict]) -> "Dataset":
        return cls(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self):
        return iter([dict(row) for row in self._rows])

    def __getitem__(self, index: int) -> dict:
        return dict(self._rows[index])

    def filter(self, function: Callable[[dict], bool]) -> "Dataset":
        return Dataset(row for row in self._rows if function(dict(row)))

    def map(self, function: Callable[[dict], dict]) -> "Dataset":
        return Dataset({**row, **function(dict(row))} for row in self._rows)

    def select(self, indices: Iterable[int]) -> "Dataset":
        return Dataset(self._rows[i] for i in indices)

    def shuffle(self, seed: int | None = None) -> "Dataset":
        rows = list(self._rows)
        random.Random(seed).shuffle(rows)
        return Dataset(rows)


def load_dataset(path: str, *args: Any, split: str | None = None, **kwargs: Any) -> Dataset:
    if (path, split) not in HUB:
        raise FileNotFoundError(
            f"hub data set {path!r} split {split!r} has no local stand-in; register its rows in datasets.HUB"
        )
    return Dataset(HUB[(path, split)])


class Features(dict):
    pass


class Value:
    def __init__(self, dtype: str, **kwargs: Any) -> None:
        self.dtype = dtype


class Sequence:
    def __init__(self, feature: Any, **kwargs: Any) -> None:
        self.feature = feature
