"""ART's module path ``art.local.backend``; the backend lives in `groupwise.backend.local`."""

from groupwise.backend.local import LocalBackend

__all__ = ["LocalBackend"]
