"""The forward the trainer runs: mixed precision, and a LoRA layer that costs one GEMM epilogue.

peft computes a LoRA layer as ``base(x) + lora_B(lora_A(x)) * scaling``: the scaling multiplies
the full [tokens, out] output and the sum is another pass over it, in the forward and again in the
backward, for each of the ~7 x layers adapted linears. Written as

    y = addmm(base(x), x A^T, (s B)^T)        # [T, out] = [T, out] + [T, r] @ [r, out]

the scale lands on the [out, r] weight and the sum in the GEMM's epilogue (beta = 1), which is
the same function (up to rounding order) with two fewer memory passes per layer and direction.
Measured on an H200 (Qwen2.5-0.5B shape, bf16, r = 8, 64 x 296 tokens): 2-4% of the update, inside
the run-to-run noise; the eager forward is bound by op launches more than by memory passes.

The fast path only takes what it computes exactly like peft: a plain `nn.Linear` base, one active
vanilla adapter (no DoRA or other variant), no dropout, no LoRA bias, not merged, no per-row
``adapter_names``; anything else runs peft's own forward. It is installed per instance for the
trainer's forward and removed after, so the inference engine (which shares the model) never sees it.

Mixed precision: with a half-precision base, peft keeps LoRA weights in fp32 (AdamW updates of
1e-5 survive) and upcasts each layer's input to fp32, which would add fp32 GEMMs and [T, out] fp32
copies (measured: half the update time of the 0.5B model above). Under autocast, with peft's input
upcast off, the adapter's matmuls run in bf16 while its master weights and gradients stay fp32:
the usual mixed precision (what HF Trainer's bf16=True gives TRL).
"""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch

__all__ = ["TrainingForward", "fast_lora_ok"]


def fast_lora_ok(layer: Any) -> bool:
    """Static conditions for the fused path (the dynamic ones are checked per call)."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft is a training dependency
        return False
    if type(layer) is not LoraLinear or type(layer.base_layer) is not torch.nn.Linear:
        return False
    for name in layer.lora_A:
        if name in getattr(layer, "lora_variant", {}):
            return False
        if not isinstance(layer.lora_dropout[name], torch.nn.Identity) or layer.lora_B[name].bias is not None:
            return False
    return True


def _fused_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    active = self.active_adapters
    if args or kwargs or self.merged or self.disable_adapters or len(active) != 1 or active[0] not in self.lora_A:
        return type(self).forward(self, x, *args, **kwargs)
    name = active[0]
    result = self.base_layer(x)  # [..., out]
    h = torch.nn.functional.linear(x, self.lora_A[name].weight)  # [..., r]
    scaled_B = self.lora_B[name].weight * self.scaling[name]  # [out, r]: the scale on the small side
    out = result.shape[-1]
    fused = torch.addmm(result.reshape(-1, out), h.reshape(-1, h.shape[-1]), scaled_B.t())
    return fused.view(result.shape)


class TrainingForward:
    """The trainer's forward context (module doc), entered once per step::

        with TrainingForward(...) as fwd:      # fused LoRA (or compiled) layers, peft's input upcast off
            for micro_batch in plan:
                with fwd.autocast():           # the forward only
                    loss = ...
                loss.backward()                # layer checkpointing recomputes with the same layers

    The patch stays for the backward because checkpointed layers run their forward again there.
    """

    def __init__(self, tuner_layers: list[Any], device_type: str, half_dtype: torch.dtype | None,
                 layer_forwards: list[tuple[torch.nn.Module, Any]] = ()):
        self.tuners = tuner_layers
        # Compiled decoder layers (trainer._layer_forwards) get the mul and add fused by the
        # compiler, and tracing through a per-step patched method would recompile: no patch then.
        self.fast = [] if layer_forwards else [m for m in tuner_layers if fast_lora_ok(m)]
        self.layer_forwards = list(layer_forwards)
        self.device_type, self.half_dtype = device_type, half_dtype

    def autocast(self) -> Any:
        if self.half_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.half_dtype)

    def __enter__(self) -> "TrainingForward":
        for m in self.fast:
            m.forward = types.MethodType(_fused_forward, m)  # an instance attribute shadows the class's
        for layer, fn in self.layer_forwards:
            layer.forward = fn
        if self.half_dtype is not None:
            self.saved = [getattr(m, "cast_input_dtype_enabled", True) for m in self.tuners]
            for m in self.tuners:
                m.cast_input_dtype_enabled = False  # what peft.helpers.disable_input_dtype_casting sets
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.half_dtype is not None:
            for m, was in zip(self.tuners, self.saved):
                m.cast_input_dtype_enabled = was
        for m in self.fast:
            m.__dict__.pop("forward", None)
        for layer, _ in self.layer_forwards:
            layer.__dict__.pop("forward", None)
