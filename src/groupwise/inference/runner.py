"""The engine's model and how one forward pass runs it.

A pass chooses how its adapter is applied (merged weights, peft's active adapter, the stacked slot
adapters of a mixed batch (stacked_lora.py), or peft's mixed-batch ``adapter_names``), installs the engine's attention and, on the CPU, the oneDNN
linears. The CUDA graphs captured over the model (decode_graphs.py) live here too: they are only
valid for this model object and its adapter slots.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from groupwise.inference.adapter_slots import SLOT_PREFIX, AdapterSlots
from groupwise.inference.attention import engine_attention
from groupwise.inference.cpu_linear import OneDNNLinears
from groupwise.inference.decode_fusion import DecodeFusion
from groupwise.inference.merged import MergedAdapter
from groupwise.inference.requests import BASE, SeqState
from groupwise.inference.stacked_lora import StackedLora
from groupwise.inference.step_state import EngineStats
from groupwise.runtime.module_walk import ModuleWalk

__all__ = ["MIXED", "ModelRunner"]

MIXED = "__mixed__"  # the graph key of mixed-adapter batches (each row's slot is a graph input)


class ModelRunner:
    """A (possibly peft-wrapped) causal LM with the engine's adapter slots and its CUDA graphs."""

    def __init__(self, model: Any, *, stats: EngineStats, cuda_graphs: bool, merge_adapters: bool,
                 onednn_linears: bool, batch_invariant: bool = False, fuse_decode: bool = False) -> None:
        self.model = model  # adapter_slots.py wraps a plain model in a PeftModel at the first adapter
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.stats = stats
        # transformers 5 renamed the forward kwarg past_key_values -> cache.
        params = inspect.signature(self.base_model().forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.cuda_graphs = cuda_graphs
        self.graphs: dict[tuple, dict[str, Any]] = {}  # decode_graphs.py: (B, Lb, adapter, sampled, filtered)
        self.graph_pool = None
        # the decode graphs' elementwise chains compiled (decode_fusion.py); None: captured as the model runs
        self.fusion = DecodeFusion() if fuse_decode else None
        self.slots = AdapterSlots()
        self.merged = MergedAdapter() if merge_adapters else None
        # Mixed-adapter batches in one fixed pass; not where a row's numbers must not depend on its mates.
        self.stacked = None if batch_invariant else StackedLora()
        self.batch_invariant = batch_invariant  # batch_invariance.py: a row's numbers never depend on its batch
        self.onednn = OneDNNLinears(rows_invariant=batch_invariant) if onednn_linears else None
        self.walk = ModuleWalk()

    def base_model(self) -> Any:
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    def tuner_layers(self) -> list[Any]:
        """peft's adapted layers (module_walk.py: walked once per adapter set, not per forward pass)."""
        return self.walk(self.model)[1]

    def peft_name(self, name: str) -> str:
        """The peft adapter (slot) holding the weights served as `name`."""
        return self.slots.peft_name(name)

    def peft_names(self, seqs: list[SeqState]) -> list[str] | None:
        """Each row's peft adapter, as peft's ``adapter_names`` takes them; None for a plain model."""
        if not self.is_peft():
            return None
        return [self.slots.peft_name(s.req.adapter or BASE) for s in seqs]

    def has_adapter(self, name: str) -> bool:
        """A peft adapter of the model's own that is not one of the engine's slots."""
        return self.is_peft() and name in self.model.peft_config and not name.startswith(SLOT_PREFIX)

    def forward(self, input_ids, position_ids, mask, cache, adapter_names, logits_to_keep=None):
        kwargs: dict[str, Any] = {self.cache_kwarg: cache, "use_cache": True}
        one_adapter = contextlib.nullcontext()
        if adapter_names is not None:
            if len(set(adapter_names)) == 1:
                # Every row uses one adapter (the usual rollout batch): make it the active one instead
                # of peft's mixed-batch path, which splits and re-scatters the batch in every adapted
                # layer (on CPU nearly doubling a decode step).
                one_adapter = self.one_adapter(adapter_names[0])
            elif self.mixed_ready(adapter_names):
                rows = torch.tensor(self.mixed_rows(adapter_names), dtype=torch.long, device=self.device)
                one_adapter = self.mixed_ctx(rows)
            else:
                kwargs["adapter_names"] = adapter_names
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = logits_to_keep
        self.stats.forward_passes += 1
        linears = self.onednn.installed(self.walk(self.model)[0]) if self.onednn else contextlib.nullcontext()
        with torch.inference_mode(), one_adapter, engine_attention(self.base_model().config, self.batch_invariant), linears:
            out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, **kwargs)
        return out.logits

    def mixed_ready(self, names: list[str]) -> bool:
        """Whether the stacked slot adapters (stacked_lora.py) can serve a batch of these peft names
        (slots and the base only); makes the stack current, dropping mixed graphs if it moved."""
        if self.stacked is None or not self.is_peft() or any(n != BASE and not n.startswith(SLOT_PREFIX) for n in names):
            return False
        # Every slot, not only this batch's: the stack (and its graphs) must not depend on the mix.
        slots = sorted((n for n in self.model.peft_config if n.startswith(SLOT_PREFIX)), key=lambda n: int(n[len(SLOT_PREFIX):]))
        moved = self.stacked.prepare(self.tuner_layers(), slots, parent_of=self._parent_ids)
        if moved is None:
            return False
        if moved:
            for key in [k for k in self.graphs if k[2] == MIXED]:
                del self.graphs[key]
        return True

    def _parent_ids(self) -> dict[int, int]:
        """id(module) -> id(its parent), for the stack's sibling groups (built once per adapter set)."""
        return {id(child): id(m) for m in self.walk(self.model)[0] for child in m.children()}

    def mixed_rows(self, names: list[str]) -> list[int]:
        """Each row's slot index in the stack (-1: the base); `mixed_ready` first."""
        assert self.stacked is not None
        return [self.stacked.index(n) for n in names]

    @contextlib.contextmanager
    def mixed_ctx(self, row_slot_N: torch.Tensor):
        """The context of a mixed pass: peft's adapters off (a layer outside the stack applies none),
        the stacked layers computing each row's own slot."""
        assert self.stacked is not None
        with self.adapter_ctx(BASE), self.stacked.serving(row_slot_N):
            yield

    def one_adapter(self, name: str | None) -> Any:
        """The context in which the model computes adapter `name` (None/BASE: the base) for every row:
        merged weights where that applies (merged.py), else peft's layers with `name` active."""
        if self.merged is not None and name not in (None, BASE) and self.is_peft():
            layers = self.tuner_layers()
            if self.merged.usable(layers, name):
                return self._merged_serving(layers, name)
        return self.adapter_ctx(name)

    @contextlib.contextmanager
    def _merged_serving(self, layers: list[Any], name: str):
        with self.adapter_ctx(BASE), self.merged.serving(layers, name):  # peft's layers off: the weights carry it
            yield

    @contextlib.contextmanager
    def adapter_ctx(self, adapter: str | None):
        """Make `adapter` (None/BASE: no adapter) the one peft's layers apply, then restore.

        peft reads the active adapter in Python, so a captured graph bakes it in. The layers' flags
        are set directly instead of calling `set_adapter` / `disable_adapter`, because those also
        flip `requires_grad` of adapters, and the trainer shares this model (its adapter must stay
        trainable).
        """
        if not self.is_peft():
            yield
            return
        layers = self.tuner_layers()
        saved = [(m._active_adapter, m._disable_adapters) for m in layers]
        for m in layers:
            if adapter in (None, BASE):
                m._disable_adapters = True
            else:
                m._active_adapter = [adapter]
                m._disable_adapters = False
        try:
            yield
        finally:
            for m, (active, disabled) in zip(layers, saved):
                m._active_adapter, m._disable_adapters = active, disabled
