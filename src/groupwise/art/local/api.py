"""ART 0.1-0.2's path of the local backend's first name: ``from art.local.api import LocalAPI``
(`LocalAPI` is `LocalBackend`). Loaded on first use, so importing this module does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["LocalAPI"]


def __getattr__(name: str) -> Any:
    if name == "LocalAPI":
        from groupwise.backend.local import LocalAPI

        return LocalAPI
    raise AttributeError(f"module 'groupwise.art.local.api' has no attribute {name!r}")


if TYPE_CHECKING:
    from groupwise.backend.local import LocalAPI
