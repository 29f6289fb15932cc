"""Several runs' GRPO updates in one pass over the base they share: a joint update.

Why. Runs of one base on one device take turns at the update (one lock per base, backend/worker.py):
four runs of a 0.5B model on an H200 spent ~0.18 s each, one after the other, in a step of ~2 s. A
small model's update leaves the GPU mostly idle: each GEMM has a few thousand rows, and each layer is
many small kernels launched from Python. One forward and backward over the rows of every run costs
the base GEMMs once on a batch several times as tall, and the launches once.

What it computes. Each micro-batch holds rows of several runs, each run's rows together; each LoRA layer
adds to the base's output each run's own adapter on that run's rows (`lora_forward.JointAdapters`).
Each run's loss is its own objective with its own normalisers and settings (`Trainer.grpo_terms`), so
the sum of the runs' losses gives each adapter, whose parameters no other run touches, the gradient of
its run's loss alone: the same update as its own step, up to float summation order. Then each run's
gradient is clipped and applied by its own optimizer (`Trainer.apply_gradient`); a run whose loss or
gradient is not finite fails alone, with its adapter as before, and the others are applied.

What it takes (`joint_problem`): GRPO steps of one optimizer update, without a KL anchor or teacher
(their scoring passes hold one adapter's values), on one rank, eager (compiled layers read one
adapter), without LoRA dropout, and with the same micro-batch and chunk settings (one plan for all).
Anything else trains alone, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from groupwise.config import TrainConfig
from groupwise.errors import ConfigError
from groupwise.training.lora_forward import JointAdapters
from groupwise.training.logprobs import token_logprobs
from groupwise.training.tokenize import TokenizedBatch
from groupwise.training.micro_batches import StepStats, collate, stat_terms
from groupwise.training.trainer import GRPO, Trainer

__all__ = ["JointPart", "JointPlan", "joint_plan", "joint_problem", "joint_train_step"]

# The settings every part of a joint step must share: one micro-batch plan and one forward serve them all.
SHARED_SETTINGS = ("micro_batch_tokens", "logprob_chunk_size", "gradient_checkpointing")


@dataclass
class JointPart:
    """One run's share of a joint update: its trainer (an adapter of the shared model), batch and settings."""

    trainer: Trainer
    batch: TokenizedBatch
    config: TrainConfig


@dataclass
class JointPlan:
    """A joint pass's micro-batches (`joint_plan`), as (part, sequence index) pairs with each part's rows
    together, and how many micro-batches the parts' own plans have."""

    micro_batches: list[list[tuple[int, int]]]
    own: int

    @property
    def worth(self) -> bool:
        """Whether the pass is worth it: its micro-batches at most half as many as the runs' own.

        Measured on an H200 (bench/joint_update.py, 4 runs of a 0.5B shape): packing 4 micro-batches into 1
        or 2 trained 1.55-1.58x faster than the runs in turn, but 8 into 6 was 0.88x and no packing (4 into 4,
        12 into 12) 0.90-0.96x: the joint forward's splits, concatenations and per-run losses cost more than a
        few saved base passes. Below half, the runs train alone, in turn, as without joint updates."""
        return 2 * len(self.micro_batches) <= self.own


def joint_problem(part: JointPart, objective: str = GRPO, updates: int = 1) -> str | None:
    """Why this run's update cannot join others' (None: it can). Alone, it trains as before."""
    c, t = part.config, part.trainer
    if objective != GRPO or updates != 1:
        return f"a {objective} step of {updates} update(s): only single GRPO updates join"
    if c.kl_coef > 0 or c.teacher is not None:
        return "a KL anchor or teacher: their scoring passes hold one adapter's values"
    if c.num_iterations != 1:
        return "num_iterations > 1"
    if c.compile:
        return "compiled decoder layers read one adapter"
    if t.process_group is not None:
        return "data-parallel ranks"
    if not JointAdapters.ok(t.tuner_layers(), [t.adapter_name]):
        return "LoRA layers with dropout, a bias, a variant or a non-Linear base"
    return None


def _compatible(parts: list[JointPart]) -> None:
    first = parts[0]
    for p in parts[1:]:
        if p.trainer.model is not first.trainer.model:
            raise ConfigError("a joint update's runs must share one model", what="joint_train_step parts")
        for name in SHARED_SETTINGS:
            if getattr(p.config, name) != getattr(first.config, name):
                raise ConfigError(f"a joint update's runs must share TrainConfig.{name}", what="joint_train_step parts")
    if len({p.trainer.adapter_name for p in parts}) != len(parts):
        raise ConfigError("a joint update trains each adapter once", what="joint_train_step parts")


def joint_train_step(parts: list[JointPart], *, step: int | list[int], plan: JointPlan | None = None,
                     progress: Callable[[int, int], None] | None = None) -> list[dict[str, float] | BaseException]:
    """One GRPO update of each part's adapter, from one forward and backward over every part's sequences
    (module doc). Returns each part's metrics (`Trainer.step_metrics`, with ``joint_runs``), or the error
    that failed that part alone (a non-finite loss or gradient). An error of the pass itself (memory, an
    exception in the model) is raised, with no adapter changed. `step`: the step number of each part (one
    for all); `plan`: `joint_plan(parts)`, when the caller made it already."""
    _compatible(parts)
    steps = step if isinstance(step, list) else [step] * len(parts)
    t0 = time.perf_counter()
    begun: list[tuple[list[torch.nn.Parameter], torch.optim.Optimizer]] = []
    try:
        for p in parts:
            begun.append(p.trainer.begin_update(p.config, GRPO))
        for params, _ in begun:  # peft freezes every adapter but the active one: all of these train
            for q in params:
                q.requires_grad_(True)
        if plan is None:
            plan = joint_plan(parts)
        sums = _forward_backward(parts, plan.micro_batches, progress)
        stats = [StepStats(*s) for s in sums]
        norms: list[float | BaseException] = []
        for p, (_, optimizer), st, k_step in zip(parts, begun, stats, steps):
            try:
                norms.append(p.trainer.apply_gradient(optimizer, st, p.config, step=k_step)[1])
            except Exception as exc:  # noqa: BLE001 - this run's failure is its own; the others go on
                norms.append(exc)
        elapsed = time.perf_counter() - t0  # the pass's time: each run waited for all of it
        results: list[dict[str, float] | BaseException] = []
        for k, (p, st, norm) in enumerate(zip(parts, stats, norms)):
            if isinstance(norm, BaseException):
                results.append(norm)
                continue
            own_plan = [[i for run, i in mb if run == k] for mb in plan.micro_batches]  # its rows of each
            metrics = p.trainer.step_metrics(st, norm, p.batch, p.config, GRPO, [mb for mb in own_plan if mb],
                                             (p.batch.trainable_tokens, len(p.batch.sequences)), elapsed)
            results.append({**metrics, "joint_runs": float(len(parts))})
        return results
    finally:
        for p, (_, optimizer) in zip(parts, begun):
            p.trainer.end_update(optimizer)


def joint_plan(parts: list[JointPart]) -> JointPlan:
    """The joint pass's micro-batches, and how many the parts' own plans have (`JointPlan`).

    Each run's own micro-batches come first (`Trainer.admit`: its token budget, priced against the free
    memory), kept whole; whole micro-batches of several runs are then packed into one wherever the packed
    one's padded tokens stay within the smallest admitted budget. So no run's rows span more micro-batches
    than alone (a LoRA layer launches each run's term once per micro-batch it has rows in), the base's
    layers run once per packed micro-batch instead of once per run's, and no micro-batch is larger than
    one the runs would train alone. Where every run's step fills its micro-batches, nothing packs and the
    pass is the runs' own micro-batches in turn."""
    units = []  # (width, part, indices): each part's own micro-batches
    budgets = []  # each admitted part's token budget (`Trainer.admit` sets it); a part with no rows has none
    for k, p in enumerate(parts):
        seqs = p.batch.sequences
        if not seqs:
            continue
        for mb in p.trainer.admit(seqs, p.config):
            units.append((max(len(seqs[i]) for i in mb), k, mb))
        budgets.append(p.trainer.last_token_budget)
    budget = min(budgets, default=0)
    units.sort(key=lambda u: (-u[0], u[1]))
    packed: list[tuple[int, list[tuple[int, int]]]] = []  # (width, rows)
    for width, k, mb in units:  # first fit, widest first: a packed batch's width is its first unit's
        rows = [(k, i) for i in mb]
        for n, (w, held) in enumerate(packed):
            if (len(held) + len(rows)) * max(w, width) <= budget:
                packed[n] = (max(w, width), held + rows)
                break
        else:
            packed.append((width, rows))
    return JointPlan([sorted(rows) for _, rows in packed], own=len(units))


def _forward_backward(parts: list[JointPart], plan: list[list[tuple[int, int]]],
                      progress: Callable[[int, int], None] | None) -> list[list[float]]:
    """Accumulate every part's gradient over the micro-batches `plan`; returns each part's `StepStats` sums."""
    leader = parts[0].trainer
    config = parts[0].config
    widths = [len(mb) * max(len(parts[k].batch.sequences[i]) for k, i in mb) for mb in plan]
    totals = [(p.batch.trainable_tokens, len(p.batch.sequences)) for p in parts]
    sums: list[list[torch.Tensor]] = [[] for _ in parts]
    joint = JointAdapters([p.trainer.adapter_name for p in parts])
    fwd = leader.training_forward(config, joint=joint)
    with fwd:  # held through the backward: checkpointed layers recompute their forward there
        for m, mb in enumerate(plan):
            counts = [sum(1 for k, _ in mb if k == part) for part in range(len(parts))]
            batch = collate([parts[k].batch.sequences[i] for k, i in mb], leader.pad_token_id, leader.device)
            joint.set_rows(counts, batch["input_ids_BT"].shape[1])
            with fwd.autocast():
                logprobs_BT = token_logprobs(leader.model, batch["input_ids_BT"], batch["attention_BT"],
                                             batch["mask_BT"], chunk_size=config.logprob_chunk_size,
                                             target_index_N=batch["target_index_N"])
            loss: Any = 0
            start = 0
            for k, n in enumerate(counts):
                if n == 0:
                    continue
                rows = slice(start, start + n)
                start += n
                own = {key: batch[key][rows] for key in ("mask_BT", "old_logprobs_BT", "advantages_B")}
                terms = Trainer.grpo_terms(logprobs_BT[rows], own, parts[k].config, totals[k])
                loss = loss + terms.loss
                sums[k].append(stat_terms(terms))
            loss.backward()
            if progress is not None:
                progress(sum(widths[:m + 1]), sum(widths))
    fields = len(StepStats.__dataclass_fields__)
    return [torch.stack(s).sum(0).tolist() if s else [0.0] * fields for s in sums]
