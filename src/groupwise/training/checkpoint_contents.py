"""What a checkpoint holds is checked before a run resumes from it, not only that its bytes are the ones
saved (training/checkpoint.py checks sizes and hashes).

Hashes prove a file is unchanged since it was written, not that what was written is usable: a NaN
adapter written by a diverged step has matching hashes, and so has an `rng.json` of the wrong shape
edited together with its state.json. Each of those used to be resumed from (a NaN run carried on; a
TypeError deep inside `random.setstate`). `contents_problem` says what is wrong instead, so
`latest_checkpoint` skips the checkpoint with a warning and the run resumes from the one before it.

The RNG states are checked by loading them into throwaway generators: the same setters a resume calls,
so whatever they would reject is caught here, and the process's own generators are not touched.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch

from groupwise.runs.store import dir_name_step

ADAPTER_FILE = "adapter_model.safetensors"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def state_problem(path: Path, step: int, cursor: Any, metrics: Any, history: Any) -> str | None:
    """What is wrong with the fields of a checkpoint's state.json (None: fine)."""
    if dir_name_step(path.name) not in (None, step):
        return (f"state.json says step {step} but the folder is {path.name} (a folder copied or renamed by hand): "
                "resuming would restart the run at the wrong step")
    if not isinstance(cursor, dict):
        return f"state.json's cursor is {type(cursor).__name__}, not an object"
    if not isinstance(metrics, dict) or not all(isinstance(k, str) and _number(v) for k, v in metrics.items()):
        return "state.json's metrics are not an object of numbers"
    if not isinstance(history, list) or not all(isinstance(row, dict) for row in history):
        return "state.json's history is not a list of rows"
    return None


def _non_finite_tensors(path: Path) -> tuple[list[str], int]:
    """Names of the floating-point tensors of a safetensors file holding nan or inf, and the tensor count."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    bad = [k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    return bad, len(tensors)


def _optimizer_problem(path: Path) -> str | None:
    from safetensors import safe_open

    meta = json.loads((path / "optimizer.json").read_text())
    groups = meta.get("param_groups") if isinstance(meta, dict) else None
    if not isinstance(groups, list) or not all(
            isinstance(g, dict) and isinstance(g.get("params"), list) and all(isinstance(n, str) for n in g["params"])
            for g in groups):
        return "optimizer.json has no list of param_groups naming their parameters"
    if not isinstance(meta.get("scalars", {}), dict) or not all(
            isinstance(v, dict) for v in meta.get("scalars", {}).values()):
        return "optimizer.json's scalars are not an object per parameter"
    named = {n for g in groups for n in g["params"]}
    with safe_open(str(path / "optimizer.safetensors"), framework="pt") as f:
        keys = list(f.keys())
    malformed = [k for k in keys if "::" not in k]
    if malformed:
        return f"optimizer.safetensors has keys not of the form '<parameter>::<state>' (e.g. {malformed[:2]})"
    unknown = sorted({k.split("::", 1)[0] for k in keys} - named)
    if unknown:
        return f"optimizer.safetensors has state for parameters its param_groups do not name (e.g. {unknown[:2]})"
    return None


def _rng_problem(path: Path) -> str | None:
    from safetensors.torch import load_file

    tensors = load_file(str(path / "rng.safetensors"))
    meta = json.loads((path / "rng.json").read_text())
    try:
        torch.Generator().set_state(tensors["torch_cpu"])
        for key in (k for k in tensors if k.startswith("torch_cuda_")):
            if tensors[key].dtype != torch.uint8 or tensors[key].dim() != 1:
                raise ValueError(f"{key} is not a byte vector")
        version, internal, gauss = meta["python"]
        random.Random().setstate((version, tuple(internal), gauss))
        if "numpy" in meta:
            import numpy as np

            name, keys, pos, has_gauss, cached = meta["numpy"]
            np.random.RandomState().set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    except (KeyError, TypeError, ValueError, RuntimeError, OverflowError) as exc:
        return f"its RNG state cannot be restored ({type(exc).__name__}: {exc})"
    return None


def contents_problem(path: Path, names: list[str]) -> str | None:
    """What is wrong with what a checkpoint's files hold (None: usable). `names`: the files it lists,
    already checked to exist and to be the bytes that were saved."""
    bad, count = _non_finite_tensors(path / ADAPTER_FILE)
    if bad:
        return (f"its adapter holds nan or inf in {len(bad)} of {count} tensors (e.g. {bad[:2]}): the step that "
                "wrote it diverged")
    if "optimizer.safetensors" in names and "optimizer.json" in names:
        problem = _optimizer_problem(path)
        if problem:
            return problem
        bad, count = _non_finite_tensors(path / "optimizer.safetensors")
        if bad:
            return f"its optimizer state holds nan or inf in {len(bad)} of {count} tensors (e.g. {bad[:2]})"
    if "rng.safetensors" in names and "rng.json" in names:
        return _rng_problem(path)
    return None
