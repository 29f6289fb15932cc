"""ART's path of the local backend: ``from art.local import LocalBackend`` ports as
``from groupwise.local import LocalBackend`` (also ``groupwise.local.backend``). Loaded on first use,
so importing this package does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["LocalBackend"]


def __getattr__(name: str) -> Any:
    if name == "LocalBackend":
        from groupwise.backend.local import LocalBackend

        return LocalBackend
    raise AttributeError(f"module 'groupwise.local' has no attribute {name!r}")


if TYPE_CHECKING:
    from groupwise.backend.local import LocalBackend
