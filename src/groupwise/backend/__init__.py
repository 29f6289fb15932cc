"""Backends: where models train and serve. `Backend` (base.py) is the public interface the loop
speaks to; ART's ``from art.backend import Backend`` is ``from groupwise.backend import Backend``.
`AnyModel` and `AnyTrainableModel` are ART's type aliases for backend signatures (strings, as in ART:
naming them imports no model code)."""

from typing import TypeAlias

from groupwise.backend.base import Backend

AnyModel: TypeAlias = "Model[Any, Any]"
AnyTrainableModel: TypeAlias = "TrainableModel[Any, Any]"

__all__ = ["AnyModel", "AnyTrainableModel", "Backend"]
