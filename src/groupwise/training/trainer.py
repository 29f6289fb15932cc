"""One GRPO step on a LoRA adapter: micro-batches, gradient accumulation, chunked log-probs, AdamW.

The trainer owns the optimizer of one adapter of a peft-wrapped model. The model object is shared with
the inference engine (one copy of the base weights in memory); the backend gives the trainer exclusive
use of its modules during a step (`engine.paused()`; on CUDA the engine may go on replaying its decode
graphs meanwhile, which run no module code), and the trainer re-activates its own adapter first, since
the engine may have switched the active adapter to serve another step.

Memory: log-probs are computed only at trainable positions, in chunks of `logprob_chunk_size`
positions, with the LM head's gradient formed chunk by chunk in the forward (training/logprobs.py), so
the [chunk, V] logits of a 150k vocabulary exist for one chunk at a time and are never recomputed.

Micro-batches are sized by a token budget (padded tokens, `micro_batch_tokens`); sequences are sorted by
length so padding is small. The loss normalisers count the whole step (training/loss.py), so summing
micro-batch gradients gives the full-batch gradient exactly.

Data-parallel: with a `process_group`, each rank trains its share of the step's sequences. The normalisers
are summed over the ranks first and the gradients after the backward (one all-reduce over a flat buffer),
so every rank takes the optimizer step of the whole batch: the same gradient as one process training the
union (up to float summation order), and bitwise the same update on every rank (an all-reduce hands every
rank the same sum; clipping and AdamW are deterministic given it).

A step is `begin_update` (the shared model taken for this adapter), the forward and backward, then
`apply_gradient` and `end_update`; training/joint.py composes the same pieces for several adapters of one
model in one pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from groupwise.config import TrainConfig, micro_batch_tokens_for
from groupwise.errors import CheckpointMismatchError, ConfigError, GroupwiseError
from groupwise.runtime.module_walk import ModuleWalk, set_training
from groupwise.training.adapters import TRAIN_ADAPTER, AdapterState, adapter_parameters, modules_of, set_active_adapter
from groupwise.training.finite import check_finite, guarded_step
from groupwise.training.layer_checkpointing import LayerCheckpointing
from groupwise.training.logprobs import base_and_decoder, head_logprobs, scatter_rows, token_logprobs, topk_candidates
from groupwise.training.logprobs import trained_hidden
from groupwise.training.lora_forward import AdapterForwards, JointAdapters, TrainingForward, holding_values
from groupwise.training.loss import LossTerms, grpo_loss, topk_reverse_kl
from groupwise.training.micro_batches import StepStats, collate, plan_micro_batches, stat_terms
from groupwise.training import step_memory
from groupwise.training.sft import sft_loss
from groupwise.training.tokenize import TokenizedBatch, TokenizedSequence

GRPO = "grpo"  # the objective of a step that names none (the other: "sft")


def _scaled(progress: Callable[[int, int], None] | None, iteration: int,
            iterations: int) -> Callable[[int, int], None] | None:
    """`progress` of one of a step's `iterations` optimizer steps, as a share of the whole step's work."""
    if progress is None or iterations == 1:
        return progress
    return lambda done, total: progress(iteration * total + done, iterations * total)


class Trainer:
    """Trains one LoRA adapter of a peft model with GRPO. Holds the AdamW state between steps."""

    def __init__(self, model: Any, *, pad_token_id: int = 0, adapter_name: str = TRAIN_ADAPTER,
                 process_group: Any = None):
        self.model = model
        # torch.distributed group of the data-parallel ranks (None: this process trains alone).
        self.process_group = process_group
        self.adapter_name = adapter_name
        self.pad_token_id = pad_token_id
        self.optimizer: torch.optim.AdamW | None = None
        self.device = next(model.parameters()).device
        self._walk = ModuleWalk()
        self._compiled: list[tuple[torch.nn.Module, Any]] | None = None
        self._adapter_forwards = AdapterForwards(adapter_name)  # the LoRA layers compiled layers call
        self._compile_failed = False
        # None: unknown, so the first step sets it either way (a caller may have enabled it).
        self._layer_checkpointing: bool | None = None
        self._checkpointing = LayerCheckpointing()
        # (the module walk, the modules this adapter's passes call, every adapter's parameters): `_lists`
        self._walk_lists: tuple[list[Any], list[torch.nn.Module], list[tuple[torch.Tensor, str]]] | None = None
        self._base_dtype = next((p.dtype for n, p in model.named_parameters() if "lora_" not in n), torch.float32)
        self._reference: dict[str, torch.Tensor] | None = None  # the KL anchor's adapter values (set_reference)
        self.reference_step: int | None = None  # the checkpoint step they are; None: the base model
        self._teacher: dict[str, torch.Tensor] | None = None  # the distillation teacher's adapter values (set_teacher)
        self._teacher_model: Any = None  # a teacher on another base model: a frozen causal LM (set_teacher)
        self.teacher: str | None = None  # what they are (TrainConfig.teacher); "base": the adapter disabled
        self._trainable: tuple[tuple[str, ...], list[tuple[str, torch.nn.Parameter]]] | None = None
        self._state = AdapterState()
        self._shape: step_memory.ModelShape | None = None
        self.last_memory: step_memory.StepMemory | None = None  # the last step's priced peak
        self.last_token_budget: int | None = None  # its micro-batch token budget, after admission

    def admit(self, seqs: list[TokenizedSequence], config: TrainConfig, *, objective: str = GRPO) -> list[list[int]]:
        """The micro-batches of `seqs`: planned by `micro_batch_tokens`, split further until the step's
        priced peak fits the device's free memory, or `MemoryBudgetError` (what to change) before any
        allocation (training/step_memory.py)."""
        lengths = [len(s) for s in seqs]
        if self._shape is None:
            self._shape = step_memory.ModelShape.of(self.model, self.adapter_name)
        trained = [max(0, sum(1 for m in s.mask[1:] if m)) for s in seqs]
        held = bool(self.optimizer is not None and self.optimizer.state)
        plan, peak, budget = step_memory.admit_micro_batches(
            self._shape, lengths, trained, token_budget=micro_batch_tokens_for(config.micro_batch_tokens, self.device.type),
            chunk_size=config.logprob_chunk_size, checkpointing=config.gradient_checkpointing,
            kl=objective == GRPO and config.kl_coef > 0, free_bytes=step_memory.device_free_bytes(self.device),
            optimizer_state_held=held, plan_fn=plan_micro_batches, device=self.device.type,
        )
        self.last_memory = peak
        self.last_token_budget = budget
        return plan

    def adapter_state(self) -> dict[str, torch.Tensor]:
        """The adapter's live parameters under the keys of peft's state dict (the checkpoint's and the
        engine's names for them: no adapter name), without a walk over the model each step (`AdapterState`)."""
        return self._state.get(self.model, self.adapter_name, self.trainable_named_parameters())

    def trainable_named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The adapter's parameters, in a fixed order (the optimizer state is saved by these names). Kept
        while the model's set of adapters is the same: on a base shared by several runs and their served
        slots, a walk over every parameter costs more with each adapter, and a step asks several times."""
        adapters = tuple(getattr(self.model, "peft_config", {}))
        if self._trainable is not None and self._trainable[0] == adapters:
            return list(self._trainable[1])
        tag = f".{self.adapter_name}."
        named = [(n, p) for n, p in self.model.named_parameters() if "lora_" in n and tag in n]
        self._trainable = (adapters, named) if named else None
        if not named:
            raise GroupwiseError(
                f"the model has no LoRA parameters of adapter {self.adapter_name!r}; wrap it with "
                "training.adapters.wrap_with_lora first"
            )
        return named

    def set_reference(self, tensors: dict[str, torch.Tensor] | None, *, step: int | None) -> None:
        """Anchor the KL term at these adapter values (keyed like `trainable_named_parameters`), those of
        checkpoint `step`; None (step None): at the base model. `train_step` checks `step` against
        `TrainConfig.kl_reference_step`, so a step never trains against another anchor than its config's."""
        if (tensors is None) != (not step):
            raise ConfigError(f"set_reference(step={step}): give a checkpoint step >= 1 with its tensors, or "
                              "set_reference(None, step=None) to anchor the KL term at the base model",
                              what="set_reference arguments")
        if tensors is None:
            self._reference = self.reference_step = None
            return
        self._reference = self._fitting(tensors, f"the KL reference of step {step}")
        self.reference_step = step

    def set_teacher(self, tensors: dict[str, torch.Tensor] | None, *, source: str, model: Any = None) -> None:
        """Distil toward these adapter values (keyed like `trainable_named_parameters`), read from `source`
        (TrainConfig.teacher); None with source "base": toward the base model; `model` (tensors None): toward
        another base model, a causal LM of the student's vocabulary on the student's device, used frozen
        (`training/teacher.py`'s `load_teacher` makes one). `train_step` checks `source` against the config's
        teacher, so a step never scores against another teacher than its config names."""
        if model is not None:
            if tensors is not None or source == "base":
                raise ConfigError(f"set_teacher(source={source!r}): a teacher model is a whole model of its own; "
                                  "give it without adapter tensors, under its own name (not 'base')",
                                  what="set_teacher arguments")
        elif (tensors is None) != (source == "base"):
            raise ConfigError(f"set_teacher(source={source!r}): give the adapter tensors of a checkpoint folder, "
                              "model= for another base model, or set_teacher(None, source='base') to distil toward "
                              "the base model", what="set_teacher arguments")
        if tensors is not None:
            tensors = self._fitting(tensors, f"the teacher {source}")
        self._teacher, self._teacher_model, self.teacher = tensors, model, source

    def _fitting(self, tensors: dict[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
        """`tensors` as copies on the adapter's devices and dtypes, or a CheckpointMismatchError naming what
        does not fit (another base model or LoraConfig)."""
        params = dict(self.trainable_named_parameters())
        missing, extra = sorted(params.keys() - tensors.keys()), sorted(tensors.keys() - params.keys())
        shapes = [f"{n}: {tuple(tensors[n].shape)} for {tuple(p.shape)}" for n, p in params.items()
                  if n in tensors and tensors[n].shape != p.shape]
        if missing or extra or shapes:
            raise CheckpointMismatchError(
                f"{what} does not fit adapter {self.adapter_name!r}: {len(missing)} tensor(s) missing (e.g. "
                f"{missing[:2]}), {len(extra)} unknown (e.g. {extra[:2]}), {len(shapes)} of another shape (e.g. "
                f"{shapes[:2]}). It must be an adapter of the same base model and LoraConfig."
            )
        return {n: tensors[n].detach().to(device=p.device, dtype=p.dtype).clone() for n, p in params.items()}

    @contextlib.contextmanager
    def _holding(self, values: dict[str, torch.Tensor] | None) -> Any:
        """The model with the adapter disabled (values None: the base), or the adapter's own parameters
        holding `values` (a second peft adapter would need set_adapter, which makes ours non-trainable)."""
        if values is None:
            with self.model.disable_adapter():
                yield
        else:
            named = self.trainable_named_parameters()
            with holding_values([p for _, p in named], [values[n] for n, _ in named]):
                yield

    def _modules(self) -> tuple[list[torch.nn.Module], list[Any]]:
        """Every module and peft's tuner layers (module_walk.py: walked once per adapter set)."""
        return self._walk(self.model)

    def tuner_layers(self) -> list[Any]:
        """peft's LoRA layers of the model (every adapter's)."""
        return self._modules()[1]

    def _set_mode(self, training: bool) -> None:
        # what model.train(training) does, on the modules this adapter's passes call (module_walk.py)
        set_training(self._lists()[0], training)

    def _lists(self) -> tuple[list[torch.nn.Module], list[tuple[torch.Tensor, str]]]:
        """(the modules this adapter's passes call: `modules_of`, every adapter's parameters:
        `adapter_parameters`), made once per module walk: on a base holding several runs' adapters, the
        mode's writes and the adapter switch otherwise visit every other adapter's modules each step."""
        modules, tuners = self._modules()
        if self._walk_lists is None or self._walk_lists[0] is not modules:
            self._walk_lists = (modules, modules_of(modules, tuners, self.adapter_name), adapter_parameters(tuners))
        return self._walk_lists[1], self._walk_lists[2]

    def _activate(self) -> list[torch.nn.Parameter]:
        # The engine may have activated another adapter (peft then freezes ours): take it back.
        # set_adapter walks every layer, so only when a layer says another adapter is active.
        modules, tuners = self._modules()
        if hasattr(self.model, "set_adapter") and any(
            m.active_adapters != [self.adapter_name] or m.disable_adapters for m in tuners
        ):
            set_active_adapter(self.model, self.adapter_name, modules, tuners, self._lists()[1])
        params = [p for _, p in self.trainable_named_parameters()]
        for p in params:
            p.requires_grad_(True)
        return params

    def _set_layer_checkpointing(self, on: bool) -> None:
        if self._layer_checkpointing == on:
            return  # the state is ours to track (we set it every step)
        self._checkpointing(base_and_decoder(self.model)[0], self._modules()[0], on)
        self._layer_checkpointing = on

    def ensure_optimizer(self, config: TrainConfig, objective: str | None = None) -> torch.optim.AdamW:
        """The adapter's AdamW, with `config`'s rate and decay. When `objective` differs from the one its
        moments were estimated on (kept in the param groups, so checkpoints carry it), the moments start
        afresh: SFT's cross-entropy gradients are several times GRPO's, so second moments carried from an SFT
        warm start shrink every GRPO update by that factor, and its first moment keeps pushing the SFT direction."""
        if self.optimizer is None:
            params = [p for _, p in self.trainable_named_parameters()]
            # On CUDA the fused kernel updates every LoRA tensor in a few launches (a LoRA has
            # ~2 x 7 x layers small tensors; the per-tensor loop costs more than the math).
            fused = self.device.type == "cuda"
            self.optimizer = torch.optim.AdamW(
                params, lr=config.learning_rate, weight_decay=config.weight_decay, fused=fused or None,
                foreach=None if fused else False,
            )
        previous = self.optimizer.param_groups[0].get("objective")
        if objective is not None and previous is not None and previous != objective:
            self.optimizer.state.clear()  # AdamW builds fresh state (step 0, zero moments) at its next step
        for group in self.optimizer.param_groups:
            group["lr"] = config.learning_rate
            group["weight_decay"] = config.weight_decay
            if objective is not None:
                group["objective"] = objective
        return self.optimizer

    def training_forward(self, config: TrainConfig, joint: JointAdapters | None = None) -> TrainingForward:
        """The forward context of a step: autocast for a half-precision base, fused LoRA layers or
        compiled decoder layers (training/lora_forward.py says why); with `joint`, LoRA layers that run
        each row through its own run's adapter (training/joint.py)."""
        half = self._base_dtype in (torch.bfloat16, torch.float16) and self.device.type in ("cuda", "cpu")
        return TrainingForward(self.tuner_layers(), self.device.type, self._base_dtype if half else None,
                               [] if joint is not None else self._layer_forwards(config), self._adapter_forwards,
                               joint=joint)

    def _layer_forwards(self, config: TrainConfig) -> list[tuple[torch.nn.Module, Any]]:
        """(decoder layer, compiled forward) pairs, installed for the update only (the engine keeps
        the eager layers: its CUDA graphs capture those).

        A LoRA'd decoder layer is many small ops, so the eager update is bound by launching them from
        Python; compiled, each layer is a few fused kernels. One compiled function per layer class
        serves every layer (the parameters are inputs). The engine's adapter slots do not recompile
        it, because the trainer's LoRA layers run `AdapterForwards` (training/lora_forward.py), which
        read only the trainer's adapter; a layer it cannot take (DoRA, a LoRA bias, a non-Linear base)
        keeps peft's forward and recompiles when adapters are added. A new sequence length compiles
        once more, with dynamic shapes. tests/training/test_compile.py pins the graph counts and the
        eager/compiled agreement; bench/train_step.py and docs/benchmarks.md have the timings.
        """
        if not config.compile or self._compile_failed:
            return []
        if self._compiled is None:
            import functools

            _, decoder = base_and_decoder(self.model)
            layers = list(getattr(decoder, "layers", []))
            by_class: dict[type, Any] = {}
            self._compiled = []
            for layer in layers:
                fn = by_class.setdefault(type(layer), torch.compile(type(layer).forward))
                self._compiled.append((layer, functools.partial(fn, layer)))
            import torch._dynamo as dynamo

            # Each layer instance may take a cache entry; the default limit (8) would send the
            # rest of a 24-layer model back to eager silently.
            dynamo.config.cache_size_limit = max(dynamo.config.cache_size_limit, 4 * len(layers) + 8)
        return self._compiled

    def _sum_over_ranks(self, values: list[float]) -> list[float]:
        """Element-wise sums over the data-parallel ranks (the values themselves without a group)."""
        if self.process_group is None:
            return values
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=self.process_group)
        return t.tolist()

    def _all_reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum the adapter gradients over the ranks, in one flat fp32 buffer (a rank without sequences
        contributes zeros)."""
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat, group=self.process_group)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
            offset += n

    def forward_backward(
        self, batch: TokenizedBatch, config: TrainConfig, *, objective: str = GRPO,
        totals: tuple[int, int] | None = None, progress: Callable[[int, int], None] | None = None,
    ) -> tuple[StepStats, list[list[int]]]:
        """Accumulate the step's gradient into `.grad` of the adapter parameters (no optimizer step).

        objective "grpo": the policy-gradient loss (training/loss.py); "sft": the masked token NLL of
        demonstrations (training/sft.py; its sum lands in `policy_loss_sum`).
        `totals`: (trainable tokens, sequences) of the whole step when `batch` is one rank's share;
        the loss normalisers use them (default: this batch's own counts).
        `progress(done, total)` is called after each micro-batch with the padded tokens done and in all."""
        sums_8, plan = self._accumulate(batch, config, objective=objective, totals=totals, progress=progress)
        # One device->host copy for the whole step (a float() per term would sync every micro-batch).
        return StepStats(*(sums_8.tolist() if sums_8 is not None else ())), plan

    def _accumulate(self, batch: TokenizedBatch, config: TrainConfig, *, objective: str,
                    totals: tuple[int, int] | None, progress: Callable[[int, int], None] | None,
                    ) -> tuple[torch.Tensor | None, list[list[int]]]:
        """`forward_backward` with the step's `StepStats` sums left on the device (None without
        sequences): the update reads them back with its gradient norm (`guarded_step`)."""
        seqs = batch.sequences
        num_tokens, num_sequences = totals if totals is not None else (batch.trainable_tokens, len(seqs))
        plan = self.admit(seqs, config, objective=objective) if seqs else []
        widths = [len(p) * max(len(seqs[i]) for i in p) for p in plan]
        sums: list[torch.Tensor] = []

        def advance() -> None:
            if progress is not None:
                progress(sum(widths[:len(sums)]), sum(widths))
        fwd = self.training_forward(config)
        with fwd:  # held through the backward too: checkpointed layers recompute their forward there
            for indices in plan:
                mb = collate([seqs[i] for i in indices], self.pad_token_id, self.device)
                ref_BT = None
                if objective == "grpo" and config.kl_coef > 0:
                    # Before the policy forward: a swapped-in reference changes the parameters in place,
                    # which after the forward would fail autograd's check of the tensors it saved.
                    ref_BT = self._scoring_logprobs(mb, config, fwd, self._reference)
                teacher_BT = teacher_hidden_NH = distill_kl_BT = None
                if objective == "grpo" and config.teacher is not None:  # before, for the same reason
                    if config.distill_estimate == "topk":
                        teacher_hidden_NH = self._teacher_hidden(mb, fwd)
                    else:
                        teacher_BT = self._scoring_logprobs(mb, config, fwd, self._teacher, self._teacher_model)
                with fwd.autocast():
                    if teacher_hidden_NH is None:
                        logprobs_BT = token_logprobs(
                            self.model, mb["input_ids_BT"], mb["attention_BT"], mb["mask_BT"],
                            chunk_size=config.logprob_chunk_size, target_index_N=mb["target_index_N"],
                            compile_head=bool(fwd.layer_forwards),  # compiled layers: the head chunks too
                        )
                    else:
                        logprobs_BT, distill_kl_BT = self._topk_distillation(mb, config, fwd, teacher_hidden_NH)
                if objective == "sft":
                    sft = sft_loss(logprobs_BT, mb["mask_BT"], num_tokens=num_tokens)
                    sft.loss.backward()
                    zero = torch.zeros((), dtype=torch.float64, device=sft.loss.device)
                    sums.append(torch.stack([sft.loss.detach().double(), sft.nll_sum.double(), zero, zero, zero,
                                             zero, sft.tokens.double(), zero]))
                    advance()
                    continue
                terms = self.grpo_terms(logprobs_BT, mb, config, (num_tokens, num_sequences), ref_BT=ref_BT,
                                        teacher_BT=teacher_BT, distill_kl_BT=distill_kl_BT)
                terms.loss.backward()
                sums.append(stat_terms(terms))
                advance()
        return (torch.stack(sums).sum(0) if sums else None), plan

    @staticmethod
    def grpo_terms(logprobs_BT: torch.Tensor, mb: dict[str, Any], config: TrainConfig, totals: tuple[int, int], *,
                   ref_BT: torch.Tensor | None = None, teacher_BT: torch.Tensor | None = None,
                   distill_kl_BT: torch.Tensor | None = None) -> LossTerms:
        """The GRPO objective (training/loss.py) of a micro-batch `mb` (`collate`'s tensors) whose rows have
        `logprobs_BT` under the policy; `totals`: the step's (trainable tokens, sequences), its normalisers."""
        num_tokens, num_sequences = totals
        return grpo_loss(
            logprobs_BT,
            mb["old_logprobs_BT"].to(logprobs_BT.dtype),
            mb["advantages_B"].to(logprobs_BT.dtype),
            mb["mask_BT"],
            epsilon=config.epsilon,
            epsilon_high=config.epsilon_high,
            cispo=config.loss == "cispo",
            normalize=config.normalize,
            num_tokens=num_tokens,
            num_sequences=num_sequences,
            max_len=config.max_seq_len,
            ref_logprobs_BT=ref_BT,
            kl_coef=config.kl_coef,
            off_policy=config.off_policy,
            importance_cap=config.importance_cap,
            teacher_logprobs_BT=teacher_BT,
            distill_coef=config.distill_coef if teacher_BT is not None or distill_kl_BT is not None else 0.0,
            distill_kl_BT=distill_kl_BT,
        )

    def _memory_metrics(self) -> dict[str, float]:
        """The step's priced and measured peaks (GB), so a run that nears its device's memory shows it."""
        out: dict[str, float] = {}
        if self.last_memory is not None:
            out["memory/estimated_peak_gb"] = self.last_memory.peak / step_memory.GB
            out["memory/micro_batch_tokens"] = float(self.last_token_budget or 0)
        measured = step_memory.measured_peak_bytes(self.device)
        if measured is not None:
            out["memory/measured_peak_gb"] = measured / step_memory.GB
        return out

    def _scoring_logprobs(self, mb: dict[str, Any], config: TrainConfig, fwd: TrainingForward,
                          values: dict[str, torch.Tensor] | None, model: Any = None) -> torch.Tensor:
        """log-probs of the micro-batch's trained tokens under the adapter holding `values` (None: the base),
        or under `model`, a teacher of another base: pi_ref of the KL term, or the distillation teacher pi_T.
        In eval mode: no dropout draws, so the scorer is one fixed policy and the policy forward's dropout is
        the same with or without it."""
        with self._scorer(values, model) as scorer, fwd.autocast():
            return token_logprobs(
                scorer, mb["input_ids_BT"], mb["attention_BT"], mb["mask_BT"],
                chunk_size=config.logprob_chunk_size, target_index_N=mb["target_index_N"],
            )

    @contextlib.contextmanager
    def _scorer(self, values: dict[str, torch.Tensor] | None, model: Any) -> Any:
        """The model that scores without gradient: `model` (a frozen teacher of another base, always in eval
        mode), else ours in eval mode, its adapter holding `values` (None: disabled)."""
        if model is not None:
            with torch.no_grad():
                yield model
            return
        training = self.model.training
        self._set_mode(False)
        try:
            with torch.no_grad(), self._holding(values):
                yield self.model
        finally:
            self._set_mode(training)

    def _teacher_hidden(self, mb: dict[str, Any], fwd: TrainingForward) -> torch.Tensor:
        """The teacher's final hidden states at the trained positions (no gradient): its LM head gives its
        top-k there (`_topk_distillation`). [N, H] is kept, not [N, V] log-probs."""
        with self._scorer(self._teacher, self._teacher_model) as scorer, fwd.autocast():
            return trained_hidden(scorer, mb["input_ids_BT"], mb["attention_BT"], mb["target_index_N"])

    def _topk_distillation(self, mb: dict[str, Any], config: TrainConfig, fwd: TrainingForward,
                           teacher_hidden_NH: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log pi at the sampled tokens, K_bt the top-k reverse KL to the teacher), both with gradient, from
        one decoder forward of the student (TrainConfig.distill_estimate='topk').   # [B, T], [B, T]"""
        B, T = mb["input_ids_BT"].shape
        index_N = mb["target_index_N"]
        hidden_NH = trained_hidden(self.model, mb["input_ids_BT"], mb["attention_BT"], index_N)
        lm_head = base_and_decoder(self.model)[0].get_output_embeddings()
        targets_N = mb["input_ids_BT"].reshape(-1).index_select(0, index_N)
        logprobs_N = head_logprobs(lm_head, hidden_NH, targets_N, config.logprob_chunk_size,
                                   compile=bool(fwd.layer_forwards))
        teacher = self._teacher_model if self._teacher_model is not None else self.model
        teacher_head = base_and_decoder(teacher)[0].get_output_embeddings()
        vocab = min(lm_head.weight.shape[0], teacher_head.weight.shape[0])  # the ids both heads score
        logp_NK, teacher_logp_NK, support_NK = topk_candidates(
            lm_head, hidden_NH, teacher_head, teacher_hidden_NH, k=config.distill_top_k, vocab=vocab,
            chunk_size=config.logprob_chunk_size)
        distill_kl_BT = topk_reverse_kl(scatter_rows(logp_NK, index_N, B, T),
                                        scatter_rows(teacher_logp_NK, index_N, B, T),
                                        scatter_rows(support_NK, index_N, B, T))
        return scatter_rows(logprobs_N, index_N, B, T), distill_kl_BT

    def _update(self, batch: TokenizedBatch, config: TrainConfig, objective: str, totals: tuple[int, int],
                params: list[torch.nn.Parameter], optimizer: torch.optim.Optimizer, *, step: int, iteration: int,
                devices: list[torch.device], progress: Callable[[int, int], None] | None,
                ) -> tuple[StepStats, list[list[int]], float]:
        """One optimizer step on `batch`: the gradient of its loss, summed over the ranks, clipped, applied."""
        optimizer.zero_grad(set_to_none=True)
        # A fixed seed per step makes dropout reproducible on resume without touching the sampler's RNG.
        step_seed = config.seed * 1_000_003 + step + iteration * 7_919
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(step_seed)
            try:
                sums_8, plan = self._accumulate(batch, config, objective=objective, totals=totals, progress=progress)
            except Exception as exc:
                if not self._compiled or not type(exc).__module__.startswith(("torch._dynamo", "torch._inductor")):
                    raise
                # Loud but not fatal: the eager step computes the same update, only slower.
                warnings.warn(f"compiling the decoder layers failed ({type(exc).__name__}: {str(exc)[:300]}); "
                              "training eagerly from now on. Set TrainConfig(compile=False) to skip compiling.")
                self._compile_failed = True
                optimizer.zero_grad(set_to_none=True)
                torch.manual_seed(step_seed)  # the same dropout draws as the failed attempt
                sums_8, plan = self._accumulate(batch, config, objective=objective, totals=totals, progress=progress)
            pending: StepStats | torch.Tensor | None = sums_8
            if self.process_group is not None:
                self._all_reduce_gradients(params)
                local = sums_8.tolist() if sums_8 is not None else [0.0] * len(dataclasses.fields(StepStats))
                pending = StepStats(*self._sum_over_ranks(local))
            stats, grad_norm = self.apply_gradient(optimizer, pending, config, step=step)
        return stats, plan, grad_norm

    def apply_gradient(self, optimizer: torch.optim.Optimizer, stats: StepStats | torch.Tensor | None,
                       config: TrainConfig, *, step: int) -> tuple[StepStats, float]:
        """The optimizer step on the adapter's accumulated `.grad`: clipped to `max_grad_norm`. `stats`: the step's
        `StepStats`, or its sums still on the device (`_accumulate`; None: no sequences), read back with the
        gradient norm in one wait (`guarded_step`). Returns (the stats, the norm before clipping). A
        non-finite loss, gradient or adapter fails the step (`NonFiniteError`) with the adapter and optimizer
        as before it, so nothing non-finite is ever checkpointed."""
        pending = stats if isinstance(stats, torch.Tensor) else None
        known = None if pending is not None else (stats if stats is not None else StepStats())
        if known is not None:  # read back already: checked before the step, which then has nothing to undo
            check_finite("loss", known.loss, step=step, config=config)
        max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
        grad_norm, read = guarded_step(
            self.trainable_named_parameters(), optimizer, step=step, config=config, max_norm=max_norm, sums=pending,
            check_sums=lambda values: check_finite("loss", StepStats(*values).loss, step=step, config=config))
        return (StepStats(*read) if read is not None else known), grad_norm  # type: ignore[return-value]

    def begin_update(self, config: TrainConfig, objective: str = GRPO
                     ) -> tuple[list[torch.nn.Parameter], torch.optim.Optimizer]:
        """Take the shared model for an update of this adapter (`end_update` gives it back): its anchor and
        teacher checked against `config`, its parameters trainable, its optimizer at `config`'s rate, its
        modules in training mode. Returns (the adapter's parameters, its optimizer)."""
        if objective == "grpo" and config.kl_coef > 0 and (config.kl_reference_step or None) != self.reference_step:
            raise ConfigError(
                f"TrainConfig.kl_reference_step={config.kl_reference_step} but the trainer's KL reference is "
                f"{'step ' + str(self.reference_step) if self.reference_step else 'the base model'}: load that "
                "step's adapter with set_reference(tensors, step=...) first (the backends do: backend/replica.py)",
                what="TrainConfig for this trainer"
            )
        if objective == "grpo" and config.teacher is not None and config.teacher != self.teacher:
            raise ConfigError(
                f"TrainConfig.teacher={config.teacher!r} but the trainer's teacher is {self.teacher!r}: load it with "
                "set_teacher(tensors, source=...) first (the backends do: backend/replica.py)",
                what="TrainConfig for this trainer"
            )
        params = self._activate()
        optimizer = self.ensure_optimizer(config, objective)
        self._set_mode(True)
        self._set_layer_checkpointing(config.gradient_checkpointing)
        step_memory.reset_measured_peak(self.device)
        return params, optimizer

    def end_update(self, optimizer: torch.optim.Optimizer) -> None:
        """Leave the shared model as the engine expects it (`begin_update`'s counterpart)."""
        optimizer.zero_grad(set_to_none=True)
        self._set_layer_checkpointing(False)  # the engine shares the model: leave it as found
        self._set_mode(False)

    def train_step(self, batch: TokenizedBatch, config: TrainConfig, *, step: int = 0,
                   objective: str = GRPO, progress: Callable[[int, int], None] | None = None) -> dict[str, float]:
        """One optimizer step on `batch` (objective "grpo" or "sft", `progress` as in `forward_backward`);
        returns its metrics."""
        t0 = time.perf_counter()
        params, optimizer = self.begin_update(config, objective)
        seqs = batch.sequences
        # the step's normalisers: this batch's counts, summed over the data-parallel ranks
        num_tokens, num_sequences = (int(v) for v in self._sum_over_ranks([batch.trainable_tokens, len(seqs)]))
        totals = (num_tokens, num_sequences)
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            # GRPO's mu (TrainConfig.num_iterations): that many optimizer steps on this batch. The step reports
            # the first's loss terms (the objective at the policy that sampled the rollouts) and the last's
            # ratio and clipping (how far the iterations moved the policy from it).
            iterations = config.num_iterations if objective == GRPO else 1
            for iteration in range(iterations):
                stats_i, plan, norm_i = self._update(batch, config, objective, totals, params, optimizer, step=step,
                                                     iteration=iteration, devices=devices,
                                                     progress=_scaled(progress, iteration, iterations))
                if iteration == 0:
                    stats, grad_norm = stats_i, norm_i
            if iterations > 1:
                stats = dataclasses.replace(stats, clipped_tokens=stats_i.clipped_tokens, ratio_sum=stats_i.ratio_sum)
        finally:
            self.end_update(optimizer)
        return self.step_metrics(stats, grad_norm, batch, config, objective, plan, totals,
                                 time.perf_counter() - t0)

    def step_metrics(self, stats: StepStats, grad_norm: float, batch: TokenizedBatch, config: TrainConfig,
                     objective: str, plan: list[list[int]], totals: tuple[int, int],
                     update_time: float) -> dict[str, float]:
        """A step's metrics row: the loss terms per trained token, the counts, the time and memory."""
        num_tokens, num_sequences = totals
        seqs = batch.sequences
        tokens = max(stats.tokens, 1.0)
        memory = self._memory_metrics()
        if objective == "sft":
            return {
                **memory,
                "loss": stats.policy_loss_sum / tokens,  # mean NLL per target token
                "grad_norm": grad_norm,
                "trainable_tokens": float(num_tokens),
                "sequences": float(num_sequences),
                "micro_batches": float(len(plan)),
                "dropped_too_long": float(batch.dropped_too_long),
                "update_time": update_time,
                "learning_rate": config.learning_rate,
            }
        return {
            **memory,
            "loss": stats.loss,
            "policy_loss": stats.policy_loss_sum / tokens,
            "kl": stats.kl_sum / tokens,
            **({"teacher_kl": stats.teacher_kl_sum / tokens} if config.teacher is not None else {}),
            "clip_fraction": stats.clipped_tokens / tokens,
            "ratio_mean": stats.ratio_sum / tokens,
            "importance_capped_fraction": stats.capped_tokens / tokens,
            "grad_norm": grad_norm,
            "trainable_tokens": float(num_tokens),
            "sequences": float(num_sequences),
            "micro_batches": float(len(plan)),
            "padded_tokens": float(sum(len(p) * max(len(seqs[i]) for i in p) for p in plan)),
            "zero_variance_fraction": batch.zero_variance_fraction,
            "forced_tokens": float(batch.forced_tokens),
            "dropped_too_long": float(batch.dropped_too_long),
            "update_time": update_time,
            "trainable_tokens_per_s": num_tokens / update_time if update_time > 0 else 0.0,
            "learning_rate": config.learning_rate,
        }
