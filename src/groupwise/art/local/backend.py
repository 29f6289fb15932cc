"""ART's module path ``art.local.backend``; the backend lives in `groupwise.backend.local`."""

from groupwise.backend.local import LocalBackend

__all__ = ["LocalBackend"]

# ART's LocalBackend looks its tokenizing and packing helpers up in this module, so programs replace them
# here (``art.local.backend.tokenize_sft_batch = ...``): that is refused, naming what to use (groupwise.hooks)
from groupwise.art.hooks import guard  # noqa: E402

guard(__name__)
