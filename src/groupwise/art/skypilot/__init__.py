"""ART's `art.skypilot`: `SkyPilotBackend` (and ART 0.2's `SkyPilotAPI`), here a `LocalBackend` that says
so (`backend.py`). Loaded on first use, so importing this package does not import torch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["SkyPilotAPI", "SkyPilotBackend"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from groupwise.art.skypilot import backend

        return getattr(backend, name)
    raise AttributeError(f"module 'groupwise.art.skypilot' has no attribute {name!r}")


if TYPE_CHECKING:
    from groupwise.art.skypilot.backend import SkyPilotAPI, SkyPilotBackend
