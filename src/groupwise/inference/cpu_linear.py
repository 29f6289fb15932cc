"""fp32 linear layers through oneDNN on the CPU, for the engine's forward passes.

On the CPU every fp32 `nn.Linear` goes to MKL's sgemm (``aten::mm``), most of an engine decode step.
oneDNN, which PyTorch ships too (``torch.ops.mkldnn._linear_pointwise``, the op inductor emits for
CPU linears), computes the same product faster at the engine's small row counts (bench/generation.py;
docs/benchmarks.md), with outputs equal to 1e-6 relative (summation order). `OneDNNLinears` installs a forward on each
plain fp32 CPU `nn.Linear` of the model for the duration of an engine pass and removes it after, so
the trainer (which shares the model and needs autograd, which this op lacks) never sees it. A call
that records gradients, or a non-fp32 input or a non-contiguous weight, takes `F.linear`. bf16 and
fp16 matmuls on the CPU already go through oneDNN; on CUDA nothing changes.
"""

from __future__ import annotations

import contextlib
import types
from typing import Any, Iterator

import torch

__all__ = ["OneDNNLinears", "ROW_BLOCK", "check_rows_invariant", "onednn_linear_available"]


def onednn_linear_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _onednn_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    w = self.weight  # read per call: merged serving (merged.py) swaps its data inside the engine's pass
    if (x.dtype is not torch.float32 or w.dtype is not torch.float32 or not w.is_contiguous()
            or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
        return torch.nn.functional.linear(x, w, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, w, self.bias, "none", [], "")


# Rows of one oneDNN call in a batch-invariant decode pass. oneDNN gives a row the same bits at 2 to 8
# rows on every CPU measured: an AMD EPYC (AVX2) at any count from 2 up, an Intel Xeon at 2 to 15 and
# other bits from 16 on (another kernel). `check_rows_invariant` verifies it on this CPU.
ROW_BLOCK = 8


def _onednn_forward_rows_invariant(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`_onednn_forward` whose every output row is the same whatever the other rows are.

    A single row takes another kernel than two (a matrix-vector product, another summation order), so
    one row is computed as two copies of itself; and the kernel may change again past some row count
    (16 on an Intel Xeon), so the rows of different requests (a decode pass, ``[B, 1, in]``) go in
    blocks of at most `ROW_BLOCK`, a lone last row again as two copies. A prefill pass holds one
    request's tokens (a batch-invariant engine prefills one request per pass), whose rows are the
    same whoever else is served: it runs whole."""
    rows = x.numel() // x.shape[-1] if x.numel() else 0
    decode = x.dim() < 2 or x.shape[-2] == 1
    if rows == 0 or (rows > 1 and (not decode or rows <= ROW_BLOCK)):
        return _onednn_forward(self, x)
    flat = x.reshape(rows, x.shape[-1])
    parts = []
    for start in range(0, rows, ROW_BLOCK):
        block = flat[start:start + ROW_BLOCK]
        if block.shape[0] == 1:
            parts.append(_onednn_forward(self, block.expand(2, -1).contiguous())[:1])
        else:
            parts.append(_onednn_forward(self, block))
    y = parts[0] if len(parts) == 1 else torch.cat(parts)
    return y.reshape(*x.shape[:-1], y.shape[-1])


_CHECKED: dict[tuple[int, int, int], str | None] = {}  # (out, in, threads) -> what failed, None: held


def check_rows_invariant(linears: list[torch.nn.Linear]) -> list[str]:
    """What `_onednn_forward_rows_invariant` relies on, checked on this CPU for each weight shape of
    `linears`: a row's bits in a call of 2 to `ROW_BLOCK` rows equal its bits computed as two copies of
    itself. Returns the shapes and row counts where they do not (empty: the promise holds here).
    The kernels depend on the shape and the thread count, not the values: checked once per process."""
    problems = []
    threads = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    for lin in linears:
        out_f, in_f = lin.weight.shape
        key = (out_f, in_f, threads)
        if key not in _CHECKED:
            x = torch.randn(ROW_BLOCK, in_f, generator=g)
            with torch.no_grad():
                alone = [_onednn_forward(lin, x[j:j + 1].expand(2, -1).contiguous())[0] for j in range(ROW_BLOCK)]
                bad = [n for n in range(2, ROW_BLOCK + 1)
                       if not all(torch.equal(row, alone[j]) for j, row in enumerate(_onednn_forward(lin, x[:n])))]
            _CHECKED[key] = (f"a [{out_f}, {in_f}] linear at {bad} rows" if bad else None)
        if _CHECKED[key] is not None and _CHECKED[key] not in problems:
            problems.append(_CHECKED[key])
    return problems


class OneDNNLinears:
    """``with linears.installed(model_modules): model(...)``: the fp32 CPU linears among the model's
    modules (the list module_walk.py caches) run through oneDNN inside the block, through MKL after.

    Which modules qualify, and their bound forwards, are worked out once per module list (a new list
    comes with a new adapter set): walking thousands of peft modules every pass would cost a few
    percent of a decode step; installing the cached forwards costs a tenth of that.
    """

    def __init__(self, rows_invariant: bool = False) -> None:
        # rows_invariant: the engine's batch-invariant mode (engine.py): a row's outputs never depend
        # on how many rows run with it, at a small cost for one-row passes.
        self._forward = _onednn_forward_rows_invariant if rows_invariant else _onednn_forward
        self._modules: list[torch.nn.Module] | None = None
        self._methods: list[tuple[torch.nn.Module, Any]] = []

    def _qualifying(self, modules: list[torch.nn.Module]) -> list[tuple[torch.nn.Module, Any]]:
        if modules is not self._modules:
            self._modules = modules
            self._methods = [(m, types.MethodType(self._forward, m)) for m in modules
                             if type(m) is torch.nn.Linear  # a subclass may compute something else
                             and m.weight.device.type == "cpu" and m.weight.dtype is torch.float32]
        return self._methods

    @contextlib.contextmanager
    def installed(self, modules: list[torch.nn.Module]) -> Iterator[None]:
        installed = []
        for m, method in self._qualifying(modules):
            if "forward" in m.__dict__:
                continue  # a layer someone else patched: leave it alone
            m.__dict__["forward"] = method  # shadows the class's (nn.Module.__setattr__'s checks: ~1.4 us)
            installed.append(m)
        try:
            yield
        finally:
            for m in installed:
                m.__dict__.pop("forward", None)
