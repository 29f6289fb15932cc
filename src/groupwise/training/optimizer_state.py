"""An optimizer's state by parameter NAME, as safetensors tensors plus JSON (checkpoint.py stores them).

`torch.optim.Optimizer.state_dict` keys its state by parameter position; a checkpoint keys it by
parameter name ("<param name>::exp_avg", ...), so a resumed optimizer matches each moment estimate to
its parameter even if peft orders the parameters differently, and a checkpoint of another adapter
shape is refused with a message instead of loading moments into the wrong tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from groupwise.errors import CheckpointMismatchError
from groupwise.training.bulk import host_copies

__all__ = ["optimizer_from_tensors", "optimizer_to_tensors"]


def optimizer_to_tensors(optimizer: torch.optim.Optimizer, names: list[str]) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors keyed "<param name>::<key>", JSON-able param groups and scalar state). The tensors are CPU
    copies, also of a CPU optimizer's: a checkpoint is written from them while training goes on."""
    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in sd["state"].items():
        name = names[index]
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{name}::{key}"] = value
            else:
                scalars.setdefault(name, {})[key] = value
    tensors = dict(zip(tensors, host_copies(list(tensors.values()))))  # one transfer from a GPU (bulk.py)
    groups = []
    for group in sd["param_groups"]:
        g = {k: (list(v) if isinstance(v, tuple) else v) for k, v in group.items() if k != "params"}
        g["params"] = [names[i] for i in group["params"]]
        groups.append(g)
    return tensors, {"param_groups": groups, "scalars": scalars, "type": type(optimizer).__name__}


def optimizer_from_tensors(
    optimizer: torch.optim.Optimizer, names: list[str], tensors: dict[str, torch.Tensor], meta: dict
) -> None:
    """Load what `optimizer_to_tensors` produced into `optimizer` (built over params named `names`)."""
    index = {n: i for i, n in enumerate(names)}
    missing = sorted({k.split("::")[0] for k in tensors} - set(index))
    if missing:
        raise CheckpointMismatchError(
            f"the checkpoint's optimizer has state for {len(missing)} parameter(s) the model lacks "
            f"(e.g. {missing[:3]}): it was saved with another LoRA config (rank, target modules). "
            "Use the same LoraConfig as the run that saved it, or start a new model name."
        )
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        name, sub = key.split("::", 1)
        state.setdefault(index[name], {})[sub] = value
    for name, subs in meta.get("scalars", {}).items():
        state.setdefault(index[name], {}).update(subs)
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        g["params"] = [index[n] for n in g["params"]]
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
