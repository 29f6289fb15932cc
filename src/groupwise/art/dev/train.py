"""ART's path ``art.dev.train`` of the step settings (``from art.dev.train import TrainConfig``); the types
are `groupwise.dev`'s."""

from groupwise.art.dev import TrainConfig, TrainSFTConfig

__all__ = ["TrainConfig", "TrainSFTConfig"]
