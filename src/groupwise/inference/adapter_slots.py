"""Adapter slots: the peft adapters that hold served weights, refilled in place when freed.

A training run serves one new adapter per step and drops old ones. Loading each as a new peft
adapter and deleting the old one would change every adapted layer's set of adapters each step, which
drops the CUDA graphs captured for the old adapter, so the new one is captured again. So the engine
keeps its adapters in slots (peft adapters named ``gw-slot-<k>``): a removed adapter frees its slot,
and the next adapter with the same LoRA shape (rank, alpha, targets, dropout, ...) is copied INTO
that slot's tensors. The layers keep their adapter set, and the slot's tensors keep their addresses,
so graphs captured for the slot stay valid with the new weights.

Requests name adapters by their served name (``agent@3``, adapter_names.py); the engine maps the
name to its slot (`Engine.peft_adapter_name`), and no error or log shows the slot's name. A slot is
never deleted (it is reused), so memory stays at the most adapters ever served at once.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from groupwise.inference.requests import EngineError
from groupwise.runtime.loading import quiet_peft, write_adapter_folder

__all__ = ["SLOT_PREFIX", "AdapterSlots"]

SLOT_PREFIX = "gw-slot-"

# What must be equal for one adapter's tensors to be copied into another's modules.
_SHAPE_KEYS = ("peft_type", "r", "lora_alpha", "lora_dropout", "use_rslora", "use_dora", "bias", "fan_in_fan_out",
               "modules_to_save", "rank_pattern", "alpha_pattern", "layers_to_transform", "lora_bias")


def _shape(config: Any) -> tuple:
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    targets = d.get("target_modules")
    targets = sorted(targets) if isinstance(targets, (list, set, tuple)) else targets
    return tuple(str(d.get(k)) for k in _SHAPE_KEYS) + (str(targets),)


@contextlib.contextmanager
def _folder(weights: dict[str, Any], config: Any) -> Iterator[str]:
    """A temporary adapter folder of `weights` and `config` (peft loads a new adapter from a folder)."""
    with tempfile.TemporaryDirectory(prefix="gw-adapter-") as folder:
        write_adapter_folder(Path(folder), weights, config)
        yield folder


class AdapterSlots:
    """Served name -> slot; free slots by LoRA shape. The engine calls it under its step lock."""

    def __init__(self) -> None:
        self.slot_of: dict[str, str] = {}
        self.free: list[str] = []
        self._serial = 0
        self._params: dict[str, dict[str, Any]] = {}  # slot -> its tensors by peft's state-dict keys

    def parameters(self, model: Any, slot: str) -> dict[str, Any]:
        """The LoRA tensors of peft adapter `slot` under the keys of peft's state dict (no adapter name),
        found by one walk over the model's parameters and kept: a slot's tensors keep their addresses
        (the module doc), and walking a base that holds many adapters costs more with each."""
        params = self._params.get(slot)
        if params is None:
            tag = f".{slot}."
            params = {n.replace(tag, "."): p for n, p in model.named_parameters() if tag in n and "lora_" in n}
            if slot.startswith(SLOT_PREFIX):  # a caller's own peft adapter may be deleted: not kept
                self._params[slot] = params
        return params

    def peft_name(self, name: str) -> str:
        """The slot of a served name; any other name (the base, a caller's own peft adapter) is itself."""
        return self.slot_of.get(name, name)

    def load(self, runner: Any, name: str, path: str | None = None, *, weights: dict[str, Any] | None = None,
             config: Any = None) -> bool:
        """Put an adapter in a slot (a free one of its shape, else a new one) of the engine's model runner
        (runner.py): the folder `path`, or `weights` (peft's state dict of it) with its peft `config`,
        which a trainer in the same process hands over without a round trip through files. True when
        it made a new slot (new modules, which peft adds in training mode)."""
        if (weights is None) != (config is None) or (path is None) == (weights is None):
            raise EngineError(f"adapter {name!r}: pass a folder path, or weights with their config (not both)")
        slot = self._free_slot(runner, path, config)
        created = slot is None
        if slot is not None:
            self._copy_into(runner.model, slot, name, path, weights, self.parameters(runner.model, slot))
            self.free.remove(slot)
        elif path is not None:
            slot = self._new_slot(runner, path)
        else:  # peft adds an adapter from a folder: write one (only when a slot is new)
            with _folder(weights, config) as folder:
                slot = self._new_slot(runner, folder)
        self.slot_of[name] = slot
        return created

    def has_free(self, runner: Any, path: str | None, config: Any) -> bool:
        """Whether `load` of this adapter (its folder `path`, or its peft `config`) refills a free slot
        rather than making one."""
        return self._free_slot(runner, path, config) is not None

    def _free_slot(self, runner: Any, path: str | None, config: Any) -> str | None:
        from peft import PeftConfig

        shape = _shape(config if config is not None else PeftConfig.from_pretrained(path))
        return next((s for s in self.free if _shape(runner.model.peft_config[s]) == shape), None)

    def reserve(self, runner: Any, n: int, *, weights: dict[str, Any], config: Any) -> None:
        """Make `n` more free slots of this adapter's shape now (holding `weights` until refilled): what a
        run will use in its steady state, so its first steps add no peft adapter (a walk over every
        module, slower with each adapter the model holds) and recapture no graphs while other runs'
        rollouts wait on this thread."""
        with _folder(weights, config) as folder:
            self.free.extend(self._new_slot(runner, folder) for _ in range(n))

    def _new_slot(self, runner: Any, path: str) -> str:
        slot = f"{SLOT_PREFIX}{self._serial}"
        self._serial += 1
        with quiet_peft():
            if runner.is_peft():
                runner.model.load_adapter(path, adapter_name=slot)
            else:
                from peft import PeftModel

                runner.model = PeftModel.from_pretrained(runner.model, path, adapter_name=slot)
                runner.graphs.clear()  # captured on the unwrapped model
        return slot

    def release(self, name: str) -> None:
        self.free.append(self.slot_of.pop(name))

    @staticmethod
    def _copy_into(model: Any, slot: str, name: str, path: str | None, weights: dict[str, Any] | None,
                   params: dict[str, Any]) -> None:
        import torch
        from peft.utils import load_peft_weights, set_peft_model_state_dict

        if weights is None:
            device = next(model.parameters()).device
            weights = load_peft_weights(path, device=str(device))
        if weights.keys() == params.keys():
            # The slot's own tensors under the same keys: copied directly, without peft's walk over the
            # model's state dict (most of the time an adapter swap took on a base of many adapters).
            with torch.no_grad():  # one multi-tensor copy, not a launch per tensor on the engine's thread
                torch._foreach_copy_(list(params.values()), [weights[key] for key in params])
            return
        with torch.no_grad():
            result = set_peft_model_state_dict(model, weights, adapter_name=slot)
        # load_state_dict copies into the existing tensors (their addresses stay: graphs hold them).
        unexpected = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
        if unexpected:
            raise EngineError(f"adapter {name!r} ({path or 'from memory'}) does not have the LoRA shape its config says: "
                               f"unexpected tensors {unexpected[:3]}")
