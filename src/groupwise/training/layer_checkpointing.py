"""Layer checkpointing switched on for each update and off after it, without transformers' enable call.

The engine shares the model, so the trainer turns checkpointing on at the start of every step that asks
for it and off at its end. transformers' switch (`activation_checkpointing_enable`, before 5.2x
`gradient_checkpointing_enable`) does more than set the layers' flags, and per step that costs:
- It registers a forward hook on the input embeddings that marks their output as needing a gradient
  (`enable_input_require_grads`), and its disable call removes that hook only for transformers' own
  PEFT integration, not for a model peft wraps from outside. So each step left one more hook, run on
  every later forward pass, the engine's included.
- The hook makes every backward compute the gradient of the embeddings' output, which nothing reads:
  with non-reentrant checkpointing an adapter's gradient needs no input that requires grad.
- Both calls walk every module (~18 ms a step at 28 layers on the 2-core CPU).

So the switch sets what transformers' own `_set_gradient_checkpointing` sets, the `gradient_checkpointing`
flag and `_gradient_checkpointing_func` of each module that has the flag, on the trainer's cached module
list. A model of the older format (a `_set_gradient_checkpointing(module, value)` of its own, remote code)
goes through transformers' calls, with its earlier hook removed first, so at most one is held: its
checkpointing may be reentrant, which needs the hook.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

from torch.utils.checkpoint import checkpoint

from groupwise.errors import ConfigError

__all__ = ["LayerCheckpointing"]

# Non-reentrant: it needs no input that requires grad (the frozen embeddings' output has none).
CHECKPOINT = functools.partial(checkpoint, use_reentrant=False)


class LayerCheckpointing:
    """``LayerCheckpointing()(base, modules, on)``: turn `base`'s layer checkpointing `on` or off.
    `base`: the transformers model; `modules`: every module of the (peft-wrapped) model, which holds
    `base`'s (the trainer's cached walk). The modules that carry the flag are found once per such list:
    `hasattr` on a module without the attribute goes through `nn.Module.__getattr__` and its exception,
    thousands of times a switch."""

    def __init__(self) -> None:
        self._flagged: tuple[list[Any], list[Any]] | None = None

    def __call__(self, base: Any, modules: list[Any], on: bool) -> None:
        if not getattr(base, "supports_gradient_checkpointing", False):
            if on:
                raise ConfigError(f"{type(base).__name__} does not support gradient checkpointing; set it False",
                                  what="gradient checkpointing setting")
            return
        setter = getattr(base, "_set_gradient_checkpointing", None)
        if setter is None or "value" in inspect.signature(setter).parameters:
            _through_transformers(base, on)
            return
        if self._flagged is None or self._flagged[0] is not modules:
            self._flagged = (modules, [m for m in modules if hasattr(m, "gradient_checkpointing")])
        flagged = self._flagged[1]
        if not flagged:
            _through_transformers(base, on)  # transformers raises its own error for such a model
            return
        for m in flagged:
            # plain attributes (no parameter or submodule): past nn.Module.__setattr__'s checks
            object.__setattr__(m, "_gradient_checkpointing_func", CHECKPOINT)
            object.__setattr__(m, "gradient_checkpointing", on)


def _through_transformers(base: Any, on: bool) -> None:
    """transformers' own switch, for a model of the older checkpointing format (module doc)."""
    new_names = hasattr(base, "activation_checkpointing_enable")  # transformers >= 5.2x; the old names warn
    if on:
        if hasattr(base, "disable_input_require_grads"):
            base.disable_input_require_grads()  # the hook the last enable registered
        if new_names:
            base.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif new_names:
        base.activation_checkpointing_disable()
    else:
        base.gradient_checkpointing_disable()
