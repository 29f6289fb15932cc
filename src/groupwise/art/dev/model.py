"""ART's path ``art.dev.model`` of the model settings (``from art.dev.model import InternalModelConfig``);
the types are `groupwise.dev`'s."""

from groupwise.art.dev import (InitArgs, InternalModelConfig, PeftArgs, TinkerArgs, TinkerNativeArgs, TinkerTrainingClientArgs,
                           TrainerArgs)

__all__ = ["InitArgs", "InternalModelConfig", "PeftArgs", "TinkerArgs", "TinkerNativeArgs", "TinkerTrainingClientArgs",
           "TrainerArgs"]
