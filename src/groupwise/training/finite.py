"""A step never leaves a non-finite adapter behind: its loss, gradient and updated adapter are checked,
and a step that produced nan or inf is undone and fails with `NonFiniteError`.

Why undo rather than only raise: the model object is shared with the inference engine and the backend
checkpoints what the trainer holds, so a NaN adapter left in place would be served, and (before this
check) was checkpointed as intact (its hashes match its NaN bytes) and resumed from. The snapshot is of
the LoRA parameters and their AdamW moments only: a few copies of the adapter, small next to the step.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from groupwise.errors import NonFiniteError
from groupwise.training.bulk import clones, finite_flags


def _hint(config: Any) -> str:
    lr = getattr(config, "learning_rate", None)
    return (f"The likely cause is the learning rate (learning_rate={lr!r}: lower it), rewards of a huge "
            "magnitude, or fp16 overflow (use bf16 or fp32).")


def check_finite(what: str, value: float, *, step: int, config: Any) -> None:
    """Raise `NonFiniteError` when a step's `what` (the loss, the gradient norm) is nan or inf."""
    if not math.isfinite(value):
        raise NonFiniteError(f"step {step}: the {what} is {value}; the update was not applied and nothing was "
                             f"checkpointed, so the adapter stays finite. {_hint(config)}")


def snapshot(params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer | None) -> tuple[list, dict, list]:
    """Copies of the parameters, of their optimizer state and of the objective its moments were estimated
    on (Trainer.ensure_optimizer), to undo optimizer steps (`restore`)."""
    values = clones(params)
    items = list(optimizer.state.items()) if optimizer is not None else []
    moments = iter(clones([v for _, s in items for v in s.values() if isinstance(v, torch.Tensor)]))
    state = {p: {k: (next(moments) if isinstance(v, torch.Tensor) else v) for k, v in s.items()} for p, s in items}
    objectives = [g.get("objective") for g in optimizer.param_groups] if optimizer is not None else []
    return values, state, objectives


def non_finite_names(named: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Names of the tensors holding a nan or inf (one device sync for all of them)."""
    if not named:
        return []
    return [n for (n, _), good in zip(named, finite_flags([t for _, t in named])) if not good]


def restore(named: list[tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer | None,
            before: tuple[list, dict, list]) -> None:
    """Put back what `snapshot` copied (an optimizer created since starts empty again)."""
    values, state, objectives = before
    with torch.no_grad():
        for (_, p), v in zip(named, values):
            p.copy_(v)
    if optimizer is not None:
        optimizer.state.clear()
        for p, s in state.items():
            optimizer.state[p] = s
        for i, group in enumerate(optimizer.param_groups):
            if i < len(objectives) and objectives[i] is not None:
                group["objective"] = objectives[i]
            else:
                group.pop("objective", None)


def guarded_step(named: list[tuple[str, torch.nn.Parameter]], optimizer: torch.optim.Optimizer, *,
                 step: int, config: Any) -> None:
    """`optimizer.step()` on the adapter `named`, undone if it leaves a tensor nan or inf, or if it fails
    part-way (AdamW raises on a step size that overflows the parameters' dtype after updating some
    moments). Either raises `NonFiniteError` naming the likely setting."""
    before = snapshot([p for _, p in named], optimizer)
    try:
        optimizer.step()
    except RuntimeError as exc:
        restore(named, optimizer, before)
        if "overflow" not in str(exc):
            raise
        raise NonFiniteError(
            f"step {step}: the optimizer step overflowed ({exc}); the step was undone (the adapter and optimizer "
            f"state are as before it) and nothing was checkpointed. {_hint(config)}"
        ) from exc
    bad = non_finite_names(named)
    if bad:
        restore(named, optimizer, before)
        raise NonFiniteError(
            f"step {step}: the optimizer step made {len(bad)} of the adapter's {len(named)} tensors nan or inf "
            f"(e.g. {bad[:2]}) from a finite gradient; the step was undone (the adapter and optimizer state are as "
            f"before it) and nothing was checkpointed. {_hint(config)}"
        )
