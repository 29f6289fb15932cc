"""The forward the trainer runs: mixed precision, and a LoRA layer that costs one GEMM epilogue.

peft computes a LoRA layer as ``base(x) + lora_B(lora_A(x)) * scaling``: the scaling multiplies
the full [tokens, out] output and the sum is another pass over it, in the forward and again in the
backward, for each of the ~7 x layers adapted linears. Written as

    y = addmm(base(x), x A^T, (s B)^T)        # [T, out] = [T, out] + [T, r] @ [r, out]

the scale lands on the [out, r] weight and the sum in the GEMM's epilogue (beta = 1), which is
the same function (up to rounding order) with two fewer memory passes per layer and direction. The
gain is small (the eager forward is bound by op launches more than by memory passes), but it is free.

The fast path only takes what it computes exactly like peft: a plain `nn.Linear` base, one active
vanilla adapter (no DoRA or other variant), no dropout, no LoRA bias, not merged, no per-row
``adapter_names``; anything else runs peft's own forward. It is installed per instance for the
trainer's forward and removed after, so the inference engine (which shares the model) never sees it.

Compiled decoder layers (TrainConfig.compile) take `AdapterForwards` instead: the same arithmetic,
reading the trainer's adapter from one plain attribute, so the compiled code's guards do not depend
on which other adapters the engine has loaded (peft's forward reads every adapter's name: each new
engine slot recompiled every layer). tests/training/test_compile.py pins both: no recompilation
after two slots are added, and the eager step's loss and gradient.

Mixed precision: with a half-precision base, peft keeps LoRA weights in fp32 (AdamW updates of
1e-5 survive) and upcasts each layer's input to fp32, which would add fp32 GEMMs and [T, out] fp32
copies, a large part of the update. Under autocast, with peft's input
upcast off, the adapter's matmuls run in bf16 while its master weights and gradients stay fp32:
the usual mixed precision (what HF Trainer's bf16=True gives TRL).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch

from groupwise.errors import GroupwiseError
from groupwise.runtime.attention_backends import varying_shape_attention

__all__ = ["AdapterForwards", "JointAdapters", "JointLayoutError", "TrainingForward", "fast_lora_ok", "holding_values"]


def fast_lora_ok(layer: Any, adapter: str | None = None, *, allow_dropout: bool = False) -> bool:
    """Static conditions for the fused path, for `adapter` or (None) every adapter of the layer; the
    dynamic ones are checked per call (eager) or per step (compiled, `AdapterForwards.install`)."""
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:  # pragma: no cover - peft is a training dependency
        return False
    if type(layer) is not LoraLinear or type(layer.base_layer) is not torch.nn.Linear:
        return False
    names = list(layer.lora_A) if adapter is None else [adapter]
    for name in names:
        if name not in layer.lora_A or name in getattr(layer, "lora_variant", {}):
            return False
        dropout = layer.lora_dropout[name]
        if not (isinstance(dropout, torch.nn.Identity) or (allow_dropout and type(dropout) is torch.nn.Dropout)):
            return False
        if layer.lora_B[name].bias is not None:
            return False
    return True


def _lora_linear(base_layer: torch.nn.Module, x: torch.Tensor, a_weight: torch.Tensor, b_weight: torch.Tensor,
                 scaling: float, dropout: torch.nn.Module | None = None) -> torch.Tensor:
    """peft's ``base(x) + lora_B(lora_A(dropout(x))) * scaling`` as one addmm (module doc).

    The calls come in peft's order (base, then dropout), so a dropout draws the same random numbers.
    """
    result = base_layer(x)  # [..., out]
    h = torch.nn.functional.linear(x if dropout is None else dropout(x), a_weight)  # [..., r]
    scaled_B = b_weight * scaling  # [out, r]: the scale on the small side
    out = result.shape[-1]
    fused = torch.addmm(result.reshape(-1, out), h.reshape(-1, h.shape[-1]), scaled_B.t())
    return fused.view(result.shape)


def _fused_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    active = self.active_adapters
    if args or kwargs or self.merged or self.disable_adapters or len(active) != 1 or active[0] not in self.lora_A:
        return type(self).forward(self, x, *args, **kwargs)
    name = active[0]
    return _lora_linear(self.base_layer, x, self.lora_A[name].weight, self.lora_B[name].weight, self.scaling[name])


# The attribute that holds (A weight, B weight, scaling, dropout or None) of the trainer's adapter
# while `AdapterForwards` is installed.
_ADAPTER_ATTR = "_groupwise_train_adapter"


def _adapter_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """One adapter's LoRA layer, for compiled decoder layers (`AdapterForwards`)."""
    if args or kwargs:  # peft's per-row adapter_names and the like: peft decides
        return type(self).forward(self, x, *args, **kwargs)
    if self.disable_adapters:  # the KL term's reference pass (model.disable_adapter()): the base only
        return self.base_layer(x)
    a_weight, b_weight, scaling, dropout = getattr(self, _ADAPTER_ATTR)
    return _lora_linear(self.base_layer, x, a_weight, b_weight, scaling, dropout)


class AdapterForwards:
    """The trainer's LoRA layers as forwards that compiled code can trust across adapter sets.

    peft's forward reads ``self.lora_A.keys()`` and ``self.active_adapters``, so compiled code over
    it guards on every layer's set of adapters: each adapter the engine adds (its slots
    ``gw-slot-<k>``, inference/adapter_slots.py) would recompile every decoder layer, for seconds.
    `_adapter_forward` reads only the base layer, one plain attribute (the adapter's tensors and
    scale, a tuple) and ``disable_adapters``, so the guards do not see the other adapters.

    It is peft's function for one adapter: the trainer's, which `install` checks is the only active
    one, not merged, in every layer it patches. A layer that fails a check keeps peft's forward,
    which stays correct and only recompiles. The bound methods are made once and the same objects
    installed every step, so the guards never depend on how dynamo treats a fresh bound method.
    """

    def __init__(self, adapter: str):
        self.adapter = adapter
        self._methods: dict[torch.nn.Module, Any] = {}  # layer -> its bound _adapter_forward, made once
        self.installed: list[torch.nn.Module] = []

    def install(self, tuner_layers: list[Any]) -> None:
        name = self.adapter
        for m in tuner_layers:
            if not fast_lora_ok(m, name, allow_dropout=True) or m.merged or m.active_adapters != [name]:
                continue
            if getattr(m, "cast_input_dtype_enabled", True) and m.lora_A[name].weight.dtype != m.base_layer.weight.dtype:
                continue  # peft would cast the input to the adapter's dtype; the patch does not
            dropout = m.lora_dropout[name]
            # Read each step (not cached): a resumed or reloaded adapter may hold new tensors or a new scale.
            setattr(m, _ADAPTER_ATTR, (m.lora_A[name].weight, m.lora_B[name].weight, m.scaling[name],
                                       None if isinstance(dropout, torch.nn.Identity) else dropout))
            if m not in self._methods:
                self._methods[m] = types.MethodType(_adapter_forward, m)
            m.forward = self._methods[m]  # an instance attribute shadows the class's
            self.installed.append(m)

    def remove(self) -> None:
        for m in self.installed:
            m.__dict__.pop("forward", None)
            m.__dict__.pop(_ADAPTER_ATTR, None)
        self.installed = []


_JOINT_ATTR = "_groupwise_joint_adapters"  # (the JointAdapters, this layer's (A, B, scaling) per adapter)


def _joint_forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A LoRA layer whose rows go through several adapters: rows ``[start, stop)`` of the batch through
    the k-th adapter of `JointAdapters.rows` (`JointAdapters` says why and what it requires)."""
    joint, weights = getattr(self, _JOINT_ATTR)
    if args or kwargs or x.dim() != 3 or tuple(x.shape[:2]) != (joint.rows[-1], joint.width):
        raise JointLayoutError(f"a joint update's LoRA layer got input of shape {tuple(x.shape)} for "
                               f"{joint.rows[-1]} rows of {joint.width} tokens: this model's adapted layers do not "
                               "see the batch as [rows, tokens, features], so its runs' updates train alone")
    result = self.base_layer(x)  # [B, T, out]: the base weights' GEMM once for every run's rows
    out = result.shape[-1]
    sizes = [joint.rows[k + 1] - joint.rows[k] for k in range(len(weights))]
    # split, not slices: a slice's backward writes a zero tensor of the whole input per slice, the split's one
    # concatenation for all of them
    xs, results = torch.split(x, sizes), torch.split(result, sizes)
    parts = []
    for (a_weight, b_weight, scaling), x_k, result_k in zip(weights, xs, results):
        if x_k.shape[0] == 0:
            continue
        h = torch.nn.functional.linear(x_k, a_weight)  # [b, T, r]
        parts.append(torch.addmm(result_k.reshape(-1, out), h.reshape(-1, h.shape[-1]),
                                 (b_weight * scaling).t()).view(result_k.shape))
    return parts[0] if len(parts) == 1 else torch.cat(parts, 0)


class JointLayoutError(GroupwiseError):
    """A joint pass met a LoRA layer whose input is not [rows, tokens, features] (a flattened or transposed
    layout): it cannot tell the runs' rows apart, so nothing was trained and the updates train alone."""


class JointAdapters:
    """Several runs' adapters trained in one forward and backward over the shared base (training/joint.py).

    A micro-batch holds the rows of each run together, run k's in ``rows[k]:rows[k+1]``; every LoRA layer
    computes the base GEMM once over all rows and adds each run's ``x A_k^T (s_k B_k)^T`` to its own rows.
    The adapters' parameters are disjoint, so each gets the gradient of its own rows' loss: the sum of the
    runs' losses has, for each adapter, the gradient of that run's loss alone.

    It takes only what it computes exactly as peft would for each run alone: `fast_lora_ok` layers (plain
    `nn.Linear` base, vanilla LoRA, no bias) with no dropout (a dropout's draws would depend on which runs
    share the pass), not merged. `ok` says whether a model's layers qualify for these adapters.
    """

    def __init__(self, adapters: list[str]):
        self.adapters = list(adapters)
        self.rows: list[int] = [0] * (len(adapters) + 1)  # set per micro-batch (`set_rows`)
        self.width = 0  # the micro-batch's padded length
        self.installed: list[torch.nn.Module] = []

    @staticmethod
    def ok(tuner_layers: list[Any], adapters: list[str]) -> bool:
        return bool(tuner_layers) and all(
            fast_lora_ok(m, name) and not m.merged for m in tuner_layers for name in adapters)

    def set_rows(self, counts: list[int], width: int) -> None:
        """Run k's rows in this micro-batch of `width` tokens a row: the next `counts[k]`."""
        self.width = width
        bounds = [0]
        for n in counts:
            bounds.append(bounds[-1] + n)
        self.rows = bounds

    def install(self, tuner_layers: list[Any]) -> None:
        for m in tuner_layers:
            # Read each step (not cached): a resumed or reloaded adapter may hold new tensors or a new scale.
            weights = [(m.lora_A[n].weight, m.lora_B[n].weight, m.scaling[n]) for n in self.adapters]
            setattr(m, _JOINT_ATTR, (self, weights))
            m.forward = types.MethodType(_joint_forward, m)
            self.installed.append(m)

    def remove(self) -> None:
        for m in self.installed:
            m.__dict__.pop("forward", None)
            m.__dict__.pop(_JOINT_ATTR, None)
        self.installed = []


class TrainingForward:
    """The trainer's forward context (module doc), entered once per step::

        with TrainingForward(...) as fwd:      # fused LoRA (or compiled) layers, peft's input upcast off
            for micro_batch in plan:
                with fwd.autocast():           # the forward only
                    loss = ...
                loss.backward()                # layer checkpointing recomputes with the same layers

    The patch stays for the backward because checkpointed layers run their forward again there.
    Eager, the LoRA layers run `_fused_forward`; with compiled `layer_forwards` they run the
    trainer's `adapter_forwards`, whose guards do not see the engine's other adapters.
    """

    def __init__(self, tuner_layers: list[Any], device_type: str, half_dtype: torch.dtype | None,
                 layer_forwards: list[tuple[torch.nn.Module, Any]] = (),
                 adapter_forwards: AdapterForwards | None = None, joint: JointAdapters | None = None):
        self.tuners = tuner_layers
        self.joint = joint
        # Compiled decoder layers (trainer._layer_forwards) take the trainer's `adapter_forwards`:
        # `_fused_forward` reads the adapter dicts, which compiled code would guard on.
        self.fast = [] if layer_forwards or joint is not None else [m for m in tuner_layers if fast_lora_ok(m)]
        self.layer_forwards = list(layer_forwards)
        self.adapter_forwards = adapter_forwards if layer_forwards else None
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
        if self.adapter_forwards is not None:
            self.adapter_forwards.install(self.tuners)  # after the cast switch: install checks it
        if self.joint is not None:
            self.joint.install(self.tuners)
        # micro-batches differ in rows and padded length: no cuDNN attention (attention_backends.py)
        self.attention = varying_shape_attention()
        self.attention.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.joint is not None:
            self.joint.remove()
        if self.adapter_forwards is not None:
            self.adapter_forwards.remove()
        if self.half_dtype is not None:
            for m, was in zip(self.tuners, self.saved):
                m.cast_input_dtype_enabled = was
        for m in self.fast:
            m.__dict__.pop("forward", None)
        for layer, _ in self.layer_forwards:
            layer.__dict__.pop("forward", None)
        self.attention.__exit__(*exc)


@contextlib.contextmanager
def holding_values(params: list[torch.Tensor], values: list[torch.Tensor]) -> Iterator[None]:
    """`params` hold `values` inside the block and their own values, bitwise, after (the KL term's
    reference pass). The copies are in place, so every forward that reads these tensors sees them:
    peft's, `_fused_forward` and `AdapterForwards`. They also bump autograd's version counters: use it
    before a forward or after its backward, never between the two."""
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p, v in zip(params, values, strict=True):
            p.copy_(v)
    try:
        yield
    finally:
        with torch.no_grad():
            for p, v in zip(params, saved):
                p.copy_(v)
