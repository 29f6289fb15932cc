"""ART's path ``art.dev.engine`` of vLLM's engine settings (``from art.dev.engine import EngineArgs``); the
type is `groupwise.dev`'s."""

from groupwise.art.dev import EngineArgs

__all__ = ["EngineArgs"]
