"""ART's module path of `yield_trajectory` and `capture_yielded_trajectory` (they live in `groupwise.core.captures`)."""

from groupwise.core.captures import capture_yielded_trajectory, yield_trajectory

__all__ = ["capture_yielded_trajectory", "yield_trajectory"]
