"""ART's path of the local backend: ``from art.local import LocalBackend`` ports as
``from groupwise.local import LocalBackend`` (also ``groupwise.local.backend``). Loaded on first use,
so importing this package does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["LocalAPI", "LocalBackend"]


def __getattr__(name: str) -> Any:
    if name in ("LocalBackend", "LocalAPI"):  # LocalAPI: ART 0.1-0.2's name
        from groupwise.backend import local

        return getattr(local, name)
    raise AttributeError(f"module 'groupwise.art.local' has no attribute {name!r}")


if TYPE_CHECKING:
    from groupwise.backend.local import LocalAPI, LocalBackend
