"""Backends: where models train and serve. `Backend` (base.py) is the public interface the loop
speaks to; ART's ``from art.backend import Backend`` is ``from groupwise.backend import Backend``."""

from groupwise.backend.base import Backend

__all__ = ["Backend"]
