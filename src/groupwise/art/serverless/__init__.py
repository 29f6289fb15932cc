"""ART's `art.serverless`: `ServerlessBackend` at ART's paths (`backend.py` says what it does here)."""

from groupwise.art.serverless.backend import ServerlessBackend

__all__ = ["ServerlessBackend"]
