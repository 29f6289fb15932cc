"""ART's module path of `auto_trajectory` and `capture_auto_trajectory` (they live in `groupwise.core.captures`)."""

from groupwise.core.captures import auto_trajectory, capture_auto_trajectory

__all__ = ["auto_trajectory", "capture_auto_trajectory"]
