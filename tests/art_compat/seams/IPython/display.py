"""`IPython.display`'s `HTML` and `display`: each object a notebook shows is kept in `SHOWN`."""

from __future__ import annotations

SHOWN: list = []


class HTML:
    def __init__(self, data: str = "") -> None:
        self.data = data


def display(*objects, **kwargs) -> None:
    SHOWN.extend(objects)
