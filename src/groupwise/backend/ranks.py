"""How one step's work is split over the data-parallel ranks, and how their answers are combined.

Apart from the driver (backend/driver.py) because these are pure functions of a batch and of the
ranks' metrics, with rules of their own that the tests pin without any worker: any split of the
sequences gives the gradient of the whole batch (the advantages are computed per group before the
split, and the trainers sum their normalisers and gradients over the ranks), so the split only
balances the work; the loss terms the trainers report are already sums over the ranks, while
micro-batches, padding and time are each rank's own. After the step the ranks must hold (and serve)
the same adapter, bit for bit: `check_identical` and `check_served` compare their fingerprints.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from groupwise.backend.protocol import Published
from groupwise.errors import GroupwiseError


class ReplicaDivergenceError(GroupwiseError):
    """Ranks hold or serve different adapters after a step (they must be bitwise equal)."""


def shard_batch(batch: Any, ranks: int) -> list[Any]:
    """Split a `TokenizedBatch`'s sequences over `ranks`: longest first, each to the rank with the fewest
    tokens so far (padding and compute follow length). Every shard carries the step's counts (groups,
    zero-variance groups, dropped), so each rank reports the step's metrics."""
    order = sorted(range(len(batch.sequences)), key=lambda i: (-len(batch.sequences[i]), i))
    load = [0] * ranks
    parts: list[list[int]] = [[] for _ in range(ranks)]
    for i in order:
        r = min(range(ranks), key=lambda k: (load[k], k))
        parts[r].append(i)
        load[r] += len(batch.sequences[i])
    return [replace(batch, sequences=[batch.sequences[i] for i in sorted(p)]) for p in parts]


def merge_ranks(metrics: list[dict[str, float]]) -> dict[str, float]:
    """One update's metrics from every rank's: the loss terms and counts are already sums over the
    ranks (the trainer reduces them); the micro-batches and padding are per rank, the time the slowest."""
    out = dict(metrics[0])
    if len(metrics) > 1:
        for key in ("micro_batches", "padded_tokens"):
            if key in out:
                out[key] = float(sum(m.get(key, 0.0) for m in metrics))
        out["update_time"] = max(m["update_time"] for m in metrics)
        for key in [k for k in out if k.startswith("memory/")]:  # each rank's device: the fullest counts
            out[key] = max(m.get(key, 0.0) for m in metrics)
        if "trainable_tokens_per_s" in out:
            out["trainable_tokens_per_s"] = out["trainable_tokens"] / max(out["update_time"], 1e-9)
    return out


def sft_step_metrics(per_update: list[dict[str, float]], last_rate: float) -> dict[str, float]:
    """A supervised step's metrics from its updates' (each already merged over the ranks): the loss
    weighted by each update's trained tokens, the first and last loss (the curve within the step), and
    the sums. A step whose every batch had rate 0 ran no update."""
    if not per_update:
        return {"updates": 0.0, "trainable_tokens": 0.0, "learning_rate": last_rate}
    tokens = sum(m["trainable_tokens"] for m in per_update)
    return {
        "loss": sum(m["loss"] * m["trainable_tokens"] for m in per_update) / max(tokens, 1.0),
        "first_loss": per_update[0]["loss"], "last_loss": per_update[-1]["loss"],
        "grad_norm": sum(m["grad_norm"] for m in per_update) / len(per_update),
        "trainable_tokens": tokens,
        "sequences": sum(m["sequences"] for m in per_update),
        "updates": float(len(per_update)),
        "dropped_too_long": sum(m["dropped_too_long"] for m in per_update),
        "update_time": sum(m["update_time"] for m in per_update),
        "learning_rate": last_rate,
    }


def check_identical(name: str, step: int, results: "list[Published]") -> None:
    """The trainer ranks' adapter fingerprints after `step` are equal (`Replica.adapter_fingerprint`)."""
    prints = [tuple(r.fingerprint or ()) for r in results]
    if len(set(prints)) > 1:
        odd = [r.rank for r in results if tuple(r.fingerprint or ()) != prints[0]]
        raise ReplicaDivergenceError(
            f"after step {step} of {name!r} the adapters of rank(s) {odd} differ from rank 0's: the data-parallel "
            "ranks no longer train the same model (a non-deterministic optimizer or a rank that skipped the "
            "gradient all-reduce). Their rollouts would sample different policies; resume from the last "
            "checkpoint."
        )


def check_served(name: str, step: int, results: "list[Published]") -> None:
    """Every rank's engine serves rank 0's bits as ``name@step`` (`Replica.served_fingerprint`): with
    generators (`BackendOptions.train_workers`), the adapter they loaded is the one trained."""
    prints = [tuple(r.served_fingerprint or ()) for r in results]
    odd = [r.rank for r in results if tuple(r.served_fingerprint or ()) != prints[0]]
    if odd:
        raise ReplicaDivergenceError(
            f"after step {step} of {name!r} the engines of rank(s) {odd} serve another adapter than rank 0's: a "
            "generator loaded a different file than the trainers checkpointed (a base_path the workers do not "
            "all see the same, or a checkpoint changed under it). Its rollouts would sample another policy; "
            "resume from the last checkpoint.")
