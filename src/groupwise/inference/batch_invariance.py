"""Batch invariance: what ``Engine(batch_invariant=True)`` promises, why a seed alone does not give it,
and what it requires of the engine's settings.

Apart from the engine (engine.py) because the mode is a property of several step modules at once, not
of the engine's bookkeeping: this is the one place that lists every cause and where each is removed.

A seeded row's sample is a function of its own logits (sampling.py), but on the CPU those logits
change by ulps with the rows beside it: attention sums over as many columns as the batch's longest
row, a one-row linear takes another kernel than two rows, a prompt's KV may come from the prefix cache
(computed in another batch), a one-adapter batch runs from merged weights, and a row's logprob takes a
shortcut unless a row beside it (greedy, top-p, top_logprobs) needs the full log-softmax. So the
logprobs the trainer takes as its old policy differed between two runs of one seed, the adapters
drifted apart by ulps, and after a few steps a sample flipped and the runs diverged.

``batch_invariant=True`` (CPU, fp32, oneDNN) removes each cause: decode attention per row over its own
columns (attention.py), a decode pass's linears in blocks of 2 to 8 rows, whose kernels give a row the
same bits (cpu_linear.py, checked on the CPU when the engine starts), one prefill pass per
request (prefill.py), no prefix cache, adapters unmerged, every logprob from the full log-softmax
(advance.py). A request's tokens and logprobs are then bitwise the same whatever runs with it (for one
thread count: CPU kernels split work by it). It costs the prefix cache's savings and a small call per
row and layer in decode, so it is opt-in: tests that train, and ``groupwise train --batch-invariant``.
"""

from __future__ import annotations

import torch

from groupwise.errors import ConfigError


def check_batch_invariant(device: torch.device, dtype: torch.dtype, onednn: bool, merge_adapters: bool | None,
                          model: torch.nn.Module | None = None) -> None:
    """Raise a `ConfigError` listing every setting that would break the promise (module doc), and, with
    `model`, every linear shape whose oneDNN kernels this CPU runs batch-dependently (cpu_linear.py)."""
    problems = []
    if device.type != "cpu" or dtype != torch.float32:
        problems.append(f"batch_invariant=True runs on the CPU in float32 (the model is on {device.type} in {dtype})")
    if not onednn:
        problems.append("batch_invariant=True needs the oneDNN linears (onednn_linear; MKL's sgemm sums a row "
                        "differently at 1, 2-3 and 4+ rows)")
    if merge_adapters:
        problems.append("batch_invariant=True serves adapters unmerged: leave merge_adapters None")
    if not problems and model is not None:
        from groupwise.inference.cpu_linear import check_rows_invariant

        linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype is torch.float32]
        varying = check_rows_invariant(linears)
        if varying:
            problems.append(
                f"this CPU's oneDNN kernels give a row other bits depending on the rows beside it "
                f"({'; '.join(varying)}, against the row computed alone), so a request's numbers would depend "
                f"on the others; batch-invariant serving cannot hold here (try another OMP_NUM_THREADS, or run "
                f"without it: results then match to float precision, not bitwise)")
    if problems:
        raise ConfigError(problems, what="engine")
