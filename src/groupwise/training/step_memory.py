"""Memory admission of an update: price a step's peak for its actual shapes before running it, and split
its micro-batches or refuse it with what to change, instead of an out-of-memory error halfway through
(or, with a CUDA allocator that cannot free, a process that hangs on the card).

The price of one micro-batch of B rows padded to T tokens, N of them trained (bytes; a = the activation
dtype's size, 2 under bf16 autocast, 4 in fp32; h hidden, i intermediate, q and kv the attention's query
and key/value widths, r the LoRA rank, V the vocabulary, C = min(N, logprob_chunk_size)) is the tensors
alive at the step's fullest moment, counted from what autograd saves (tests/training/test_step_memory.py
checks the count against the tensors a step really holds):

- weights: the base model's parameters and buffers, as loaded (shared with the engine);
- adapter: the LoRA parameters, their gradients and AdamW's two fp32 moments;
- kept activations, without gradient checkpointing, B*T tokens times, per decoder layer,
  `LAYER_TOKEN_BYTES`: each RMSNorm its fp32 input (transformers' norms compute in fp32: the upcast copy,
  or the fp32 input itself) and its output, which the LoRA layers after it save (2 x (4 + a) h); the
  attention's rotated q and k, v and its output, which o_proj's LoRA saves too ((2q + 2kv) a: fused
  attention kernels save no [T, T] matrix, and the output's layout is o_proj's input without a copy);
  the MLP's gate, up, silu(gate) and their product (4i a); each LoRA target's rank-r intermediate (r a,
  and its dropped-out input plus a byte of mask when lora dropout > 0). The frozen base linears save
  nothing (a frozen weight needs no input for its gradient), nor the embeddings, whose output needs no
  gradient, so the first layer's input norm saves nothing, as many bytes as the final norm's input keeps.
  With gradient checkpointing each layer keeps only its input (h a), plus the final norm's input;
- then two moments, of which the step's peak is the fuller:
  the head: the trained positions' hidden states and their gradient (2 N h a) and one [C, V] chunk of
  logits with its log-softmax in fp32 alive beside it (training/logprobs.py): C V (a + 4), plus a fp32
  copy of the logits that torch makes for a bf16 log-softmax (only fp16 on CUDA reads the half-precision
  input in place);
  the backward: at its start, with every kept activation still alive, the gradients of the layer being
  differentiated: the MLP's three [T, i] gradients and the norms' fp32 ones (3 i a + 2 x 4 h); with
  checkpointing, that layer's recomputed activations (one `LAYER_TOKEN_BYTES`) too;
- reference: with kl_coef > 0, the no-grad reference forward before the policy's, whose peak is one
  layer's working set and a logits chunk: it adds to the step's peak only where it exceeds the policy's.

How a device measures: the count above is what CUDA's allocator has allocated at the fullest moment
(torch.cuda.max_memory_allocated); it holds as counted there. On the CPU what can be read, and what runs
out, is the process's resident memory, and the CPU allocator does not hand what the backward frees layer
by layer back to the gradients it allocates next, nor the head's chunk: there the two moments add up and
the backward reaches about 0.7 of the kept activations on top, as measured (`DeviceMemory`, the one
device-kind term; bench/memory_estimate.py, docs/benchmarks.md).

The engine's KV cache is not priced here: it is allocated already, so the device's free memory excludes
it (inference/batch_memory.py prices the engine's own batches).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from groupwise.errors import MemoryBudgetError
from groupwise.runtime.memory import allocatable_bytes

__all__ = ["DEVICE_MEMORY", "DeviceMemory", "ModelShape", "StepMemory", "admit_micro_batches", "device_free_bytes",
           "device_memory", "estimate_micro_batch",
           "measured_peak_bytes", "reset_measured_peak", "resident_bytes"]

GB = 2**30
# Smallest token budget admission splits down to before it refuses: below one sequence a micro-batch
# cannot be split further anyway (plan_micro_batches gives a longer sequence a batch of its own).
MIN_TOKEN_BUDGET = 1


@dataclass(frozen=True)
class ModelShape:
    """What the price of a step depends on, read once from the model."""

    layers: int
    hidden: int
    intermediate: int
    q_dim: int
    kv_dim: int
    vocab: int
    act_bytes: int  # activation dtype's size: the base dtype (autocast for a half-precision base)
    lora_rank: int
    lora_targets: int  # LoRA'd linear layers per decoder layer
    lora_in_dims: int  # sum of their input widths (their dropout's saved inputs when dropout > 0)
    lora_dropout: bool
    weight_bytes: int
    adapter_param_bytes: int
    adapter_params: int
    float16: bool = False  # the activations are fp16 (not bf16): CUDA's log-softmax reads them in place

    @classmethod
    def of(cls, model: Any, adapter_name: str) -> ModelShape:
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        hidden = int(config.hidden_size)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        layers = int(config.num_hidden_layers)
        tag = f".{adapter_name}."
        weight_bytes = adapter_bytes = adapter_params = 0
        a_dims: list[int] = []
        ranks: list[int] = []
        for name, p in model.named_parameters():
            if "lora_" in name and tag in name:
                adapter_bytes += p.numel() * p.element_size()
                adapter_params += p.numel()
                if "lora_A" in name:
                    ranks.append(int(p.shape[0]))
                    a_dims.append(int(p.shape[1]))
            elif "lora_" not in name:
                weight_bytes += p.numel() * p.element_size()
        weight_bytes += sum(b.numel() * b.element_size() for b in model.buffers())
        base_dtype = next((p.dtype for n, p in model.named_parameters() if "lora_" not in n), torch.float32)
        peft_config = getattr(model, "peft_config", {}).get(adapter_name)
        dropout = bool(getattr(peft_config, "lora_dropout", 0.0) or 0.0)
        return cls(
            layers=layers, hidden=hidden, intermediate=int(getattr(config, "intermediate_size", 4 * hidden)),
            q_dim=heads * head_dim, kv_dim=kv_heads * head_dim, vocab=int(config.vocab_size),
            act_bytes=torch.empty((), dtype=base_dtype).element_size(),
            lora_rank=max(ranks, default=0), lora_targets=len(a_dims) // max(layers, 1),
            lora_in_dims=sum(a_dims) // max(layers, 1), lora_dropout=dropout,
            weight_bytes=weight_bytes, adapter_param_bytes=adapter_bytes, adapter_params=adapter_params,
            float16=base_dtype == torch.float16,
        )

    @property
    def layer_token_bytes(self) -> int:
        """Bytes one decoder layer keeps for the backward per token (module doc)."""
        a = self.act_bytes
        norms = 2 * (4 + a) * self.hidden
        attention = (2 * self.q_dim + 2 * self.kv_dim) * a
        mlp = 4 * self.intermediate * a
        lora = self.lora_targets * self.lora_rank * a
        if self.lora_dropout:
            lora += self.lora_in_dims * (a + 1)
        return norms + attention + mlp + lora

    @property
    def working_token_bytes(self) -> int:
        """Bytes a token takes in the backward's working set on top of what is kept: the gradients of the
        layer being differentiated, the MLP's three [T, i] ones and the norms' fp32 ones (module doc)."""
        return 3 * self.intermediate * self.act_bytes + 2 * 4 * self.hidden

    def chunk_bytes(self, chunk: int, device: DeviceMemory) -> int:
        """One [chunk, V] block of logits with its fp32 (or wider) log-softmax, and the upcast copy torch
        makes first unless the kernel reads fp16 logits in place (module doc)."""
        a = self.act_bytes
        lsm = max(a, 4)
        in_place = a == lsm or (self.float16 and device.fp16_softmax_in_place)
        return chunk * self.vocab * (a + (0 if in_place else lsm) + lsm)


@dataclass(frozen=True)
class DeviceMemory:
    """How a device kind's memory adds up beyond the tensors alive at one moment: the estimate's one term
    that is not the model's arithmetic (module doc). `DEVICE_MEMORY` holds one per device kind."""

    kind: str
    # The backward's gradients come on top of at least this share of the activations the backward
    # frees (all kept ones; with checkpointing, the recomputed layer's and its forward's temporaries):
    # what the allocator does not reuse for them. CUDA's caching allocator reuses them at once: 0. The
    # CPU's resident memory, measured against the counted activations (four shapes, two runs: 0.53-0.74):
    # 0.7, the estimate erring high rather than low.
    unreused_share: float
    # The head's moment and the backward's add up instead of taking turns (the CPU's resident
    # high-water mark keeps what the head freed).
    moments_add: bool
    # log_softmax(fp16, dtype=float32) reads the fp16 logits without an fp32 copy (CUDA's kernel; bf16 is
    # copied everywhere).
    fp16_softmax_in_place: bool


DEVICE_MEMORY = {
    "cuda": DeviceMemory("cuda", unreused_share=0.0, moments_add=False, fp16_softmax_in_place=True),
    "cpu": DeviceMemory("cpu", unreused_share=0.7, moments_add=True, fp16_softmax_in_place=False),
}


def device_memory(device_type: str) -> DeviceMemory:
    """The device kind's `DeviceMemory`; a kind not measured yet gets the CPU's, the larger estimate."""
    return DEVICE_MEMORY.get(device_type, DEVICE_MEMORY["cpu"])


@dataclass(frozen=True)
class StepMemory:
    """The priced peak of one micro-batch of a step, by part (bytes)."""

    weights: int
    adapter: int  # parameters + gradients + AdamW moments
    activations: int  # kept for the backward
    backward: int  # the backward's working set on top of them (with checkpointing, the recomputed layer too)
    logits: int  # the head's moment: the trained hidden states, their gradient and one logits chunk
    reference: int  # what the KL reference pass adds over the policy's peak (0 without one)
    rows: int
    width: int
    moments_add: bool = False  # the device counts the head's and the backward's bytes together (DeviceMemory)

    @property
    def peak(self) -> int:
        transient = self.logits + self.backward if self.moments_add else max(self.logits, self.backward)
        return self.weights + self.adapter + self.activations + transient + self.reference

    @property
    def step_bytes(self) -> int:
        """What the step allocates on top of the loaded weights and adapter parameters."""
        return self.peak - self.weights

    def describe(self) -> str:
        both = "+" if self.moments_add else "or"
        return (f"{self.peak / GB:.2f} GB (weights {self.weights / GB:.2f} + adapter with gradients and AdamW "
                f"{self.adapter / GB:.3f} + kept activations {self.activations / GB:.2f} + (backward "
                f"{self.backward / GB:.2f} {both} logits {self.logits / GB:.2f})"
                + (f" + KL reference {self.reference / GB:.2f}" if self.reference else "")
                + f", for a micro-batch of {self.rows} x {self.width} tokens)")


def estimate_micro_batch(shape: ModelShape, *, rows: int, width: int, trained: int, chunk_size: int,
                         checkpointing: bool, kl: bool, device: DeviceMemory | str) -> StepMemory:
    """The peak of a micro-batch of `rows` sequences padded to `width` tokens, `trained` of them trained,
    on a device of kind `device` (its `DeviceMemory`, or the kind: "cuda", "cpu")."""
    dev = device_memory(device) if isinstance(device, str) else device
    tokens = rows * width
    a = shape.act_bytes
    gradients = tokens * shape.working_token_bytes
    if checkpointing:
        kept = shape.layers * tokens * shape.hidden * a + tokens * shape.hidden * 4  # + the final norm's input
        # The layer recomputed in the backward keeps its activations; its forward frees temporaries of
        # about as many bytes, and the backward its activations: both count for what is not reused.
        recomputed = tokens * shape.layer_token_bytes
        working = recomputed + max(gradients, int(2 * recomputed * dev.unreused_share))
    else:
        # the final norm's fp32 input in place of the first layer's input norm, which saves nothing
        kept = shape.layers * tokens * shape.layer_token_bytes
        working = max(gradients, int(kept * dev.unreused_share))
    chunk_bytes = shape.chunk_bytes(min(max(trained, 1), chunk_size), dev)
    head = 2 * trained * shape.hidden * a + chunk_bytes
    transient = head + working if dev.moments_add else max(head, working)
    reference = 0
    if kl:
        reference_peak = tokens * (2 * shape.hidden * a + shape.working_token_bytes) + chunk_bytes
        reference = max(0, reference_peak - (kept + transient))
    # parameters (as stored), gradients (as stored) and two fp32 moments
    adapter = 2 * shape.adapter_param_bytes + 2 * 4 * shape.adapter_params
    return StepMemory(weights=shape.weight_bytes, adapter=adapter, activations=kept, backward=working, logits=head,
                      reference=reference, rows=rows, width=width, moments_add=dev.moments_add)


def _plan_peak(shape: ModelShape, plan: list[list[int]], lengths: list[int], trained: list[int], *,
               chunk_size: int, checkpointing: bool, kl: bool, device: DeviceMemory | str) -> StepMemory:
    return max((estimate_micro_batch(shape, rows=len(p), width=max(lengths[i] for i in p),
                                     trained=sum(trained[i] for i in p), chunk_size=chunk_size,
                                     checkpointing=checkpointing, kl=kl, device=device) for p in plan),
               key=lambda m: m.peak)


def admit_micro_batches(shape: ModelShape, lengths: list[int], trained: list[int], *, token_budget: int,
                        chunk_size: int, checkpointing: bool, kl: bool, free_bytes: int | None,
                        optimizer_state_held: bool, plan_fn: Any,
                        device: DeviceMemory | str) -> tuple[list[list[int]], StepMemory, int]:
    """(plan, its priced peak, the token budget it was planned with): `plan_fn(lengths, budget)` with
    `token_budget` halved until the step's extra memory fits `free_bytes` (None: unknown, not checked), priced
    for a `device` of that kind (`DeviceMemory`).

    The loaded weights and adapter parameters are held already (and, after the first step, AdamW's
    moments), so only what the step allocates on top is compared with the free memory. Raises
    `MemoryBudgetError` naming what to change when even one sequence per micro-batch does not fit."""
    budget = token_budget
    while True:
        plan = plan_fn(lengths, budget)
        peak = _plan_peak(shape, plan, lengths, trained, chunk_size=chunk_size, checkpointing=checkpointing, kl=kl,
                          device=device)
        held = shape.adapter_param_bytes + (8 * shape.adapter_params if optimizer_state_held else 0)
        need = peak.step_bytes - held
        if free_bytes is None or need <= free_bytes:
            return plan, peak, budget
        if all(len(p) == 1 for p in plan) or budget <= MIN_TOKEN_BUDGET:
            break
        budget = max(MIN_TOKEN_BUDGET, budget // 2)
    longest = max(lengths)
    hints = [f"shorter sequences (the longest is {longest} tokens: lower max_tokens of the rollouts, or "
             "max_seq_len, which drops longer ones)"]
    if not checkpointing:
        with_ckpt = _plan_peak(shape, plan, lengths, trained, chunk_size=chunk_size, checkpointing=True, kl=kl,
                               device=device)
        hints.insert(0, f"TrainConfig(gradient_checkpointing=True) (then about {with_ckpt.describe()})")
    if peak.logits > peak.activations // 4:
        hints.append(f"a smaller logprob_chunk_size (now {chunk_size})")
    hints.append("a smaller base model or a half-precision dtype, or free the device (another process or the "
                 "engine's KV cache: a smaller max_batch_size)")
    raise MemoryBudgetError(
        f"this update needs about {peak.describe()} even with one sequence per micro-batch, and the device has "
        f"{free_bytes / GB:.2f} GB free beyond what the step holds already (micro_batch_tokens was {token_budget}). "
        "Running it would run out of memory. Use " + "; or ".join(hints) + "."
    )


def device_free_bytes(device: torch.device) -> int | None:
    """Bytes a step on `device` can still allocate (runtime/memory.py's `allocatable_bytes`); None where
    it cannot be read."""
    return allocatable_bytes(device)


def reset_measured_peak(device: torch.device) -> None:
    """Start the step's high-water mark: torch's on CUDA; on Linux the process's resident one (VmHWM,
    reset by writing 5 to /proc/self/clear_refs), which is all a CPU step can be measured by."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif device.type == "cpu":
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:  # not Linux, or not allowed: ru_maxrss (the process's life) is read instead
            pass


def measured_peak_bytes(device: torch.device) -> int | None:
    """The step's measured peak: torch's allocated high-water mark on CUDA; on the CPU the process's
    resident high-water mark since `reset_measured_peak` (VmHWM; where that cannot be reset, ru_maxrss,
    the process's whole life). On the CPU it counts the interpreter, the engine and the weights too."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    if device.type != "cpu":
        return None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource  # Unix only: imported where the /proc figure is missing

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss) * (1 if sys.platform == "darwin" else 1024)


def resident_bytes() -> int | None:
    """The process's resident memory now (VmRSS), where /proc has it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
