"""A backend's memory budget: what a base model and its runs will hold on a device, checked against what
the device has free before the engine and the trainers allocate.

Several backends or processes on one host share its GPUs and its RAM. A process that starts on a card
that cannot hold it does not always fail alone: the memory it takes first is what another run's next
step needed, and that run dies of an out-of-memory error it did nothing to cause. So once a worker has
loaded a base model's weights, before it builds the engine and the trainers, it states its budget (`MemoryBudget`: the base weights, the engine's
KV cache, one update's activations, the adapters with their AdamW state) and refuses with
`MemoryBudgetError` (the figures and what to change) when the device's free memory cannot hold the rest,
dropping the weights again. Every run that joins the base later (`SharedBase.hold_adapter`) is counted
too (`MemoryBudget.models`): a join the device has no room for is refused the same way, with the budget
the runs already there were admitted with taken as held, and the runs on the base go on.

The estimate is the least a run trains with (KV for `max_batch_size` sequences of `KV_TOKENS` tokens,
activations of one `ACTIVATION_TOKENS`-token micro-batch), not its peak: a run with long sequences or
large micro-batches needs more. A user who knows the peak states it, ``memory_budget_gb``: that figure is
checked instead, and on CUDA it also caps this process's allocator
(`torch.cuda.set_per_process_memory_fraction`), so a run that outgrows it fails itself, not its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groupwise.config import CPU_MICRO_BATCH_TOKENS
from groupwise.errors import MemoryBudgetError

__all__ = ["MemoryBudget", "MemoryBudgetError", "available_bytes", "check_budget", "estimate_budget"]

KV_TOKENS = 512  # columns of the engine's KV cache the estimate counts per sequence (it grows with use)
ACTIVATION_TOKENS = CPU_MICRO_BATCH_TOKENS  # tokens of one micro-batch: the CPU job's
# Bytes of activations a decoder layer keeps for the backward, per token and hidden unit, in units of the
# activation dtype's size: measured ~1.5 MB a token for fp32 SmolLM2 (30 layers x 576), i.e. ~22.
ACTIVATION_FACTOR = 24
GB = 2**30


@dataclass
class MemoryBudget:
    """Bytes a base model and `models` runs on it need on one device."""

    weights: int
    kv_cache: int
    activations: int
    adapter: int  # one run's LoRA tensors with their gradient and AdamW moments
    models: int = 1
    stated: int | None = None  # memory_budget_gb, when the user gave it: it replaces the estimate

    @property
    def total(self) -> int:
        if self.stated is not None:
            return self.stated
        return self.weights + self.kv_cache + self.activations + self.models * self.adapter

    def describe(self) -> str:
        if self.stated is not None:
            return f"{self.stated / GB:.2f} GB (memory_budget_gb)"
        return (f"{self.total / GB:.2f} GB (weights {self.weights / GB:.2f} + KV cache {self.kv_cache / GB:.2f} + "
                f"update {self.activations / GB:.2f} + {self.models} adapter(s) {self.models * self.adapter / GB:.3f})")


def _text_config(config: Any) -> Any:
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def estimate_budget(*, parameters: int, config: Any, dtype_bytes: int, max_batch_size: int, lora_rank: int,
                    lora_targets: int, models: int = 1, stated_gb: float | None = None) -> MemoryBudget:
    """The budget of a base model of `parameters` weights (`config`: its transformers config) stored in
    `dtype_bytes` bytes each, served `max_batch_size` sequences at a time, with `models` runs whose
    adapters have rank `lora_rank` on `lora_targets` linear layers per decoder layer."""
    c = _text_config(config)
    layers, hidden = int(c.num_hidden_layers), int(c.hidden_size)
    heads = int(c.num_attention_heads)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(c, "head_dim", None) or hidden // heads)
    kv = 2 * layers * kv_heads * head_dim * dtype_bytes * max_batch_size * KV_TOKENS
    activations = ACTIVATION_FACTOR * layers * hidden * dtype_bytes * ACTIVATION_TOKENS
    # each adapted layer: A [r, in] and B [out, r], ~2 r hidden values; fp32 param, grad and two moments
    adapter = layers * lora_targets * 2 * lora_rank * hidden * 4 * 4
    return MemoryBudget(weights=parameters * dtype_bytes, kv_cache=kv, activations=activations, adapter=adapter,
                        models=models, stated=None if stated_gb is None else int(stated_gb * GB))


def available_bytes(device: Any) -> tuple[int, int] | None:
    """(free, total) bytes of `device`: the card's on CUDA, the machine's available RAM on the CPU
    (MemAvailable: free plus what the kernel can reclaim). None where it cannot be read."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    if device.type == "cpu":
        try:
            fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
            return int(fields["MemAvailable"].split()[0]) * 1024, int(fields["MemTotal"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):  # not Linux
            return None
    return None


def check_budget(budget: MemoryBudget, device: Any, *, base_model: str, held: int = 0) -> None:
    """Raise `MemoryBudgetError` when `device` has less free memory than `budget` beyond the `held`
    bytes of it already allocated (the loaded weights); with a stated budget on CUDA, cap this process's
    allocations at it."""
    import torch

    room = available_bytes(device)
    if room is None:
        return
    free, total = room
    free += held  # what the budget counts and this process already holds
    where = f"{device}" + (" (available RAM)" if torch.device(device).type == "cpu" else "")
    if budget.total > free:
        raise MemoryBudgetError(
            f"{base_model} needs about {budget.describe()} on {where}, which has {free / GB:.2f} GB free of "
            f"{total / GB:.2f} GB. Loading it would take memory that other runs on this device need. Free the device "
            "(another process or backend holds it), use another device, a smaller base model or dtype, a smaller "
            "LocalBackend(max_batch_size=...), or register fewer models on it."
        )
    if budget.stated is not None and torch.device(device).type == "cuda":
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget.stated / total), torch.device(device))
