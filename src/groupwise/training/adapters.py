"""Creating LoRA adapters on a model with peft: the first one (`wrap_with_lora`) and another run's on the
same base weights (`add_lora_adapter`), both from a seeded stream; making one the active one again
(`set_active_adapter`, over `adapter_parameters`), and the modules one's passes call (`modules_of`); and
copying one out (`adapter_snapshot`) for a checkpoint or an engine.

Apart from the trainer (training/trainer.py) because creating an adapter and training one happen in
different places: a replica (backend/replica.py) wraps the shared base model and adds a run's adapter
when the run registers, long before any step, and the tests and benches wrap models without a trainer.
What the two share is the rule that makes runs reproducible: a fresh adapter is a function of its
`LoraConfig` (seed included) alone, whichever other adapters the model already holds.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from groupwise.config import LoraConfig
from groupwise.runtime.loading import quiet_peft
from groupwise.training.bulk import host_copies

TRAIN_ADAPTER = "default"  # peft's name of the adapter created by get_peft_model


def _peft_lora_config(lora: LoraConfig) -> Any:
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


@contextlib.contextmanager
def _seeded(model: Any, seed: int) -> Any:
    """peft draws lora_A from the global RNG; a private seeded stream makes runs reproducible (a
    restarted run and an uninterrupted one must start from the same adapter)."""
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # seeds the CUDA generators too
        yield


def wrap_with_lora(model: Any, lora: LoraConfig, *, adapter_name: str = TRAIN_ADAPTER) -> Any:
    """Wrap a causal LM with a fresh LoRA adapter (peft). The base weights stay frozen and shared."""
    from peft import get_peft_model

    with _seeded(model, lora.seed), quiet_peft():
        return get_peft_model(model, _peft_lora_config(lora), adapter_name=adapter_name)


def add_lora_adapter(peft_model: Any, lora: LoraConfig, adapter_name: str) -> None:
    """Add another fresh trainable adapter to a peft model (another run on the same base weights). It
    starts from the tensors `wrap_with_lora` gives a model of its own with the same `lora`: peft visits
    the layers in the same order and draws from the same seeded stream."""
    with _seeded(peft_model, lora.seed), quiet_peft():
        peft_model.add_adapter(adapter_name, _peft_lora_config(lora))


def peft_state(model: Any, adapter_name: str,
               named: list[tuple[str, torch.nn.Parameter]] | None = None) -> tuple[dict[str, torch.Tensor], bool]:
    """peft's state dict of the adapter (what `save_pretrained` writes: keys without the adapter's name),
    and whether every entry is one of `named`'s live parameters, whole (then a caller may keep the key
    -> parameter map while those parameters live: `AdapterState`)."""
    from peft import get_peft_model_state_dict

    saved = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers="auto")
    if named is None:
        return saved, False
    live = {(p.data_ptr(), tuple(p.shape), p.dtype): p for _, p in named}
    mapped = {k: live.get((v.data_ptr(), tuple(v.shape), v.dtype)) for k, v in saved.items()}
    if len(mapped) != len(named) or any(p is None for p in mapped.values()):
        return saved, False
    return mapped, True  # type: ignore[return-value]


class AdapterState:
    """`peft_state` of one adapter, kept while its parameters are the same objects.

    peft builds its state dict by walking every module and every parameter of the model: on a base
    shared by several runs, each with its served slots, that walk is most of what a checkpoint
    snapshot or an adapter check costs, every step. The keys and the parameters they name do not
    change while the parameters live (optimizer steps and loads write into them), so the map is taken
    from peft once and reused; a changed parameter list (another adapter set) takes it again, and an
    adapter whose state dict holds anything but its own parameters (saved embedding layers) is taken
    from peft every time."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] | None = None
        self._state: dict[str, torch.Tensor] = {}

    def get(self, model: Any, adapter_name: str, named: list[tuple[str, torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
        key = tuple(id(p) for _, p in named)
        if key != self._key:
            state, whole = peft_state(model, adapter_name, named)
            if not whole:
                return state
            self._key, self._state = key, state
        return dict(self._state)


def set_active_adapter(model: Any, name: str, modules: list[torch.nn.Module], tuners: list[Any],
                       params: list[tuple[torch.Tensor, str]] | None = None) -> None:
    """peft's ``PeftModel.set_adapter(name)``: the same flags, on lists of the model's modules and of its
    tuner layers the caller keeps (module_walk.py), without peft's two walks over every module (a base
    holding four runs' adapters and their served slots has 5,500 modules: the walks were half of a
    switch). `params`: `adapter_parameters(tuners)`, kept by the caller with its walk; then each
    parameter's ``requires_grad`` is written only where it differs from what peft would leave. peft's
    own layer call walks every adapter's modules in every layer, so a switch cost grew with the runs a
    base holds (eight runs: 28% of a train step's samples in a profile on an H200). What those calls do
    not cover (a prompt adapter, a merged layer, an auxiliary wrapper such as modules_to_save, weights a
    variant keeps frozen) goes to peft's own."""
    try:
        from peft.utils.other import AuxiliaryTrainingWrapper
    except ImportError:  # another peft: its own walk
        AuxiliaryTrainingWrapper = None
    config = getattr(model, "peft_config", {}).get(name)
    tuner = getattr(model, "base_model", None)
    if (AuxiliaryTrainingWrapper is None or config is None or config.is_prompt_learning
            or not hasattr(tuner, "active_adapter") or any(m.merged for m in tuners)
            or any(isinstance(m, AuxiliaryTrainingWrapper) for m in modules)):
        model.set_adapter(name)
        return
    model.active_adapter = name
    if params is None or any(getattr(m, "frozen_peft_weight_names", None) for m in tuners):
        for m in tuners:
            m.set_adapter(name)
    else:
        for m in tuners:
            m._active_adapter = [name]  # what the layer's set_adapter stores
        for p, adapter in params:  # ... and the flags it writes: only the active adapter trains
            if p.requires_grad != (adapter == name):
                p.requires_grad_(adapter == name)
    tuner.active_adapter = name


def _per_adapter(tuners: list[Any], attrs: str) -> Any:
    """(adapter name, entry) of each entry of the tuner layers' per-adapter dicts (lora_A, lora_B, ...): their
    `attrs` (peft's ``adapter_layer_names``, or with ``"other"`` its ``other_param_names`` too, lora_dropout's)."""
    for m in tuners:
        names = m.adapter_layer_names if attrs == "weights" else (*m.adapter_layer_names, *m.other_param_names)
        for attr in names:
            held = getattr(m, attr, None)
            if hasattr(held, "items"):  # other_param_names also name plain dicts (r, scaling): no modules there
                yield from held.items()


def adapter_parameters(tuners: list[Any]) -> list[tuple[torch.Tensor, str]]:
    """(parameter, its adapter's name) for every adapter weight of peft's tuner layers: the parameters whose
    ``requires_grad`` peft's layer ``set_adapter`` writes (its leaf tensors, of every adapter layer)."""
    return [(p, adapter) for adapter, entry in _per_adapter(tuners, "weights")
            for p in ([entry] if isinstance(entry, torch.Tensor) else entry.parameters()) if p.is_leaf]


def modules_of(modules: list[torch.nn.Module], tuners: list[Any], name: str) -> list[torch.nn.Module]:
    """`modules` less those of the base's adapters other than `name` (their entries in the tuner layers'
    per-adapter dicts: lora_A, lora_B, lora_dropout, ...), which adapter `name`'s passes never call. A base
    holding eight runs' adapters and their served slots has 13,600 modules, 90% of them other adapters'."""
    others = {id(x) for adapter, entry in _per_adapter(tuners, "other")
              if adapter != name and isinstance(entry, torch.nn.Module) for x in entry.modules()}
    return [m for m in modules if id(m) not in others]


def adapter_snapshot(model: Any, adapter_name: str,
                     state: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], Any]:
    """(CPU copies of the adapter's tensors, its config) as peft's `save_pretrained` writes them: its
    state dict and config functions, without the model card it rewrites on every save. `state`: that
    state dict when the caller has it (`AdapterState`). The config carries peft's ``auto_mapping`` (set
    for a config without a task type) as `auto_mapping_dict`."""
    import copy

    tensors = state if state is not None else peft_state(model, adapter_name)[0]
    # copies that a later update does not change, on a CPU model too; from a GPU one transfer (bulk.py)
    tensors = dict(zip(tensors, host_copies(list(tensors.values()))))
    config = copy.deepcopy(model.peft_config[adapter_name])
    if config.base_model_name_or_path is None:
        config.base_model_name_or_path = getattr(model.base_model.model, "name_or_path", None) or None
    config.inference_mode = True
    if config.task_type is None:
        base = model._get_base_model_class(is_prompt_tuning=config.is_prompt_learning)
        config.auto_mapping_dict = {"base_model_class": base.__name__, "parent_library": base.__module__}
    return tensors, config
