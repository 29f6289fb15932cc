"""The decode graph's elementwise chains fused by `torch.compile`: the model's own RMSNorm forward, its
rotary function, and the graph's sampling, each compiled once and used while a decode graph is captured.

Why. A CUDA graph removes the launches' CPU cost, not the kernels: a decode pass of Qwen2.5-0.5B at 512 rows
replays ~1,390 kernels, ~58 per layer, most of them elementwise steps over a few hundred KB (an RMSNorm
is a cast, a square, a mean, an add, an rsqrt, two products and a cast back; the rotary embedding a dozen
more), each a few microseconds of the device's time however small, and the sampling's passes over
[rows, vocabulary] in fp32 (a cast, a division, a softmax, a pad, block sums, an argmax, a log-softmax:
~310 MB each at 512 rows). vLLM compiles its model before it captures its graphs for the same reason.

What. The pieces compiled are functions the model already has, not copies of them: the class's own
``forward`` of every module whose class is an RMSNorm (called with the module as its first argument, so
Dynamo traces the model's code: Gemma's ``1 + weight`` as Llama's ``weight``), and the attention module's
module-level ``apply_rotary_pos_emb`` (the name every transformers decoder uses). The numbers are those of
the same ops fused: the same fp32 arithmetic, summed in another order only inside a row's own reduction.
Outside the decode graphs' captures nothing changes: the trainer's forward on the shared model, prefill
passes and CPU engines run the model's code as it is.

Whole decoder layers are not compiled: their projections are peft's LoRA layers or the stacked slots'
(stacked_lora.py), whose Python the captured pass must run as it is. `dynamic=True`: one compilation
serves every batch and length bucket (the first capture pays it, a few seconds; later ones reuse it).
A compilation that fails (no Triton, no C compiler) is reported once and the engine captures unfused.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import Any, Callable, Iterator

import torch

from groupwise.inference.sampling import sample_fixed

__all__ = ["DecodeFusion"]

ROTARY = "apply_rotary_pos_emb"
_COMPILED: dict[tuple[Any, str], Callable] = {}  # (a norm class or a function, backend) -> its compiled form


class DecodeFusion:
    """The compiled pieces of one engine's decode graphs (`installed` around a capture; `sample`)."""

    def __init__(self, backend: Any = "inductor") -> None:
        self.backend = backend
        self.enabled = True

    def _compile(self, key: Any, fn: Callable) -> Callable:
        # Process-wide: the engines of one process (several backends, a judge's) compile each piece once.
        compiled = _COMPILED.get((key, self.backend))
        if compiled is None:
            compiled = _COMPILED[(key, self.backend)] = torch.compile(fn, dynamic=True, backend=self.backend)
        return compiled

    def sample(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """`sampling.sample_fixed`, fused: its passes over the vocabulary read the logits a few times
        instead of ~10 full reads and writes."""
        return self._compile(sample_fixed, sample_fixed)(*args)

    @contextlib.contextmanager
    def installed(self, modules: list[torch.nn.Module]) -> Iterator[None]:
        """Inside, the RMSNorms among a model's `modules` (the runner's cached walk, runtime/module_walk.py)
        and its attention's rotary function run compiled. Restored after."""
        norms = [m for m in modules if _is_rms_norm(m)]
        sources = {sys.modules.get(type(m).__module__) for m in modules if _is_attention(m)} - {None}
        for m in norms:
            m.forward = _bound(self._compile(type(m), type(m).forward), m)
        patched: list[tuple[Any, Callable]] = []
        for module in sources:
            fn = getattr(module, ROTARY, None)
            if callable(fn) and not hasattr(fn, "_torchdynamo_orig_callable"):
                patched.append((module, fn))
                setattr(module, ROTARY, self._compile(fn, fn))
        try:
            yield
        finally:
            for m in norms:
                del m.forward  # the class's forward again
            for module, fn in patched:
                setattr(module, ROTARY, fn)

    def disable(self, exc: BaseException) -> None:
        """A compilation failed: report it once and capture unfused from now on."""
        if self.enabled:
            reason = " ".join(str(exc).split("\n\n")[0].split())  # Dynamo's message before its hints, one line
            warnings.warn(f"the decode graphs' fusion (torch.compile) failed ({type(exc).__name__}: {reason}); "
                          "capturing them unfused from now on (slower decode, the same tokens)")
        self.enabled = False


def _bound(compiled: Callable, module: torch.nn.Module) -> Callable:
    def forward(*args: Any, **kwargs: Any) -> Any:
        return compiled(module, *args, **kwargs)

    return forward


def _is_rms_norm(m: torch.nn.Module) -> bool:
    weight = getattr(m, "weight", None)
    return (type(m).__name__.endswith("RMSNorm") and isinstance(weight, torch.Tensor) and weight.dim() == 1
            and "forward" not in m.__dict__)


def _is_attention(m: torch.nn.Module) -> bool:
    return type(m).__name__.endswith("Attention") and hasattr(m, "o_proj")
