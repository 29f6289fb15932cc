"""ART 0.2's path of `SkyPilotAPI` (`groupwise.skypilot.backend`: a `LocalBackend` that says so)."""

from groupwise.art.skypilot.backend import SkyPilotAPI

__all__ = ["SkyPilotAPI"]
