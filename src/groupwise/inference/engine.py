"""The batching generation engine: continuous batching on transformers, per-request LoRA, logprobs.

How it runs. Rollouts are asyncio coroutines; the engine is stepped by the process's compute thread
(groupwise/runtime/compute.py: one thread for all torch work, which the CPU's OpenMP needs to run at full
speed) and answers through futures (`await engine.generate(request)` works from any event loop).
Each step, under the model lock:

1. prefill (prefill.py): waiting requests are admitted while slots are free (while rows decode, once
   the oldest has waited one prefill's time: `StepState.admission_due`); known prompt prefixes come
   from the prefix cache (prefix_cache.py), the rest runs in ONE forward pass, each choice samples
   its first token, and the prompt's KV is copied to the slots of the request's other choices.
2. decode (decode.py): every running sequence feeds its last token in ONE forward pass ([k, 1]
   inputs); tokens are sampled, stops checked, finished rows retired and their callers answered
   (advance.py).

The step modules are functions of two objects the engine owns: the step state (step_state.py:
queues, slot cache, counters) and the model runner (runner.py: the model, its adapters, its
forward pass and CUDA graphs).

Requests thus join and leave the running batch at token granularity. The KV cache is a
preallocated slot cache (kv_cache.py): slot i holds sequence i's keys/values at columns
0..length-1, running sequences are kept in slots 0..k-1 (a finished one's slot is refilled by
moving the last one down), and attention reads columns [0, length) through a 4-D mask.

Adapters. The model is a transformers causal LM or a peft `PeftModel` (the backend shares one base
model between engine and trainer). Each request names an adapter or the base (None). Served adapters
live in slots (adapter_slots.py); a batch mixing them runs through the slots' stacked weights
(stacked_lora.py), other mixes through peft's ``adapter_names=[...]`` (``"__base__"``: the base).

CUDA. The decode step replays CUDA graphs captured per (batch bucket, attention-length bucket,
adapter or the stacked slots); the slot buffers never move, so graphs stay valid until the cache
grows. Where no row needs top-p, a grammar or top_logprobs, the graph samples too and computes its
next inputs, so the next step is launched before the CPU reads this one's tokens (decode_graphs.py).
Decode attention reads each K/V head once for its group of query heads (attention.py).

CPU. A batch whose rows share one adapter runs from merged weights (merged.py): on the CPU a
LoRA layer's tiny matmuls cost their overhead, not their FLOPs. fp32 linears run through oneDNN
for the engine's passes (cpu_linear.py): the same products as MKL's sgemm, faster at these shapes.

Logprobs are the model's raw log-softmax (sampling.py says why).

Batch invariance (``batch_invariant=True``, opt-in): a request's tokens and logprobs do not depend on
what runs beside it; batch_invariance.py says why that takes more than a seed, and what it costs.

Why not transformers' own continuous batching (``generate_batch`` / ``init_continuous_batching``,
paged attention, in transformers 5): it returns logprobs and takes per-request
logits-processor kwargs, but has no per-request LoRA adapter (one of our requirements: every
rollout names its step), no grammar masks per request, and its scheduler owns the model, which we
share with the trainer (`paused()`). The slot cache here is small enough to own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch

from groupwise.runtime.compute import compute_thread
from groupwise.runtime.memory import memory_pressed
from groupwise.runtime.module_walk import set_training
from groupwise.config import DEFAULT_MAX_BATCH_SIZE
from groupwise.errors import ConfigError
from groupwise.inference.adapter_slots import SLOT_PREFIX
from groupwise.inference.advance import retire
from groupwise.inference.batch_invariance import check_batch_invariant
from groupwise.inference.batch_memory import BatchMemory
from groupwise.inference.cpu_linear import onednn_linear_available
from groupwise.inference.decode import decode
from groupwise.inference.kv_cache import SlotBuffers
from groupwise.inference.prefill import admit, prefill_isolated
from groupwise.inference.prefix_cache import PrefixCache
from groupwise.inference.requests import (BASE, DEFAULT_MAX_NEW_TOKENS, Completion, EngineError, GenerationRequest,
                                          GenerationResult, PromptTooLongError, RequestFailedError, RequestMemoryError,
                                          RequestState,
                                          SeqState, check_request)
from groupwise.inference.runner import ModelRunner
from groupwise.inference.step_state import EngineStats, StepState
from groupwise.rollout.stalls import STALLS
from groupwise.runtime.special_tokens import special_tokens

__all__ = ["Completion", "Engine", "EngineError", "EngineStats", "GenerationRequest", "GenerationResult",
           "PromptTooLongError", "RequestFailedError", "RequestMemoryError"]


class Engine:
    """Continuous-batching generation over one (possibly peft-wrapped) model. See the module doc."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_new_tokens_default: int = DEFAULT_MAX_NEW_TOKENS,
        max_seq_len: int | None = None,
        max_prefill_tokens: int = 8192,
        initial_capacity: int = 256,
        cuda_graphs: bool | None = None,
        prefix_cache_tokens: int = 4096,  # KV of this many prompt tokens kept for reuse; 0 turns it off
        prefix_block_size: int = 16,  # its allocation unit (hits are still token-exact)
        merge_adapters: bool | None = None,  # serve a one-adapter batch from merged weights (merged.py); default: on CPU
        onednn_linear: bool | None = None,  # fp32 CPU linears through oneDNN (cpu_linear.py); default: where available
        max_kv_bytes: int | None = None,  # the slot cache's largest size: the context shrinks to what fits
        batch_invariant: bool = False,  # a request's numbers never depend on the others (CPU; batch_invariance.py)
        memory_limit_bytes: int | None = None,  # bytes its caches and passes may hold; None: what the device has free
        release_when_idle: bool | None = None,  # free KV, prefixes (CUDA: graphs) in an idle pause; None: see below
        fuse_decode: bool | None = None,  # compile the decode graphs' norms, rotary and sampling (decode_fusion.py); default: with CUDA graphs
        decode_during_updates: bool | None = None,  # replay decode graphs while a trainer updates (`paused`); default: with CUDA graphs
    ):
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_new_tokens_default = max_new_tokens_default
        self.max_prefill_tokens = max_prefill_tokens
        if onednn_linear and not onednn_linear_available():
            raise ConfigError("onednn_linear=True, but this PyTorch build has no oneDNN linear "
                              "(torch.backends.mkldnn); leave it None to use it only where available",
                              what="Engine settings")
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        onednn = onednn_linear_available() if onednn_linear is None else onednn_linear
        if batch_invariant:
            check_batch_invariant(device, dtype, onednn, merge_adapters, model)
            prefix_cache_tokens, merge_adapters = 0, False
        stats = EngineStats()
        graphs = (device.type == "cuda") if cuda_graphs is None else cuda_graphs
        if decode_during_updates and not graphs:
            raise ConfigError("decode_during_updates=True needs cuda_graphs: an engine decodes beside a trainer only by "
                              "replaying captured graphs (an eager pass runs the modules the trainer changes)",
                              what="Engine settings")
        # Off CUDA the "graphs" are eager stand-ins (decode_graphs.EagerReplay) that run the modules: True there
        # only tests the scheduling, and the backend never updates beside them (backend/worker.py).
        self.decode_during_updates = (graphs and device.type == "cuda") if decode_during_updates is None else decode_during_updates
        self.runner = ModelRunner(
            model, stats=stats, cuda_graphs=graphs,
            merge_adapters=(device.type == "cpu") if merge_adapters is None else merge_adapters,
            onednn_linears=onednn and device.type == "cpu" and dtype == torch.float32, batch_invariant=batch_invariant,
            fuse_decode=(graphs and device.type == "cuda") if fuse_decode is None else fuse_decode)
        base = self.runner.base_model()
        config = base.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.context_length = int(max_seq_len or getattr(text_config, "max_position_embeddings", 4096))
        self.vocab_size = int(base.get_input_embeddings().num_embeddings)  # valid ids: [0, this)
        heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
        # The slot cache holds max_batch_size rows of the whole context (kv_cache.py): bounded by
        # max_kv_bytes, one long prompt cannot make it outgrow the machine's memory.
        self.kv_bytes_per_token = 2 * text_config.num_hidden_layers * max_batch_size * kv_heads * head_dim * (
            torch.empty((), dtype=dtype).element_size())
        self.kv_budget_limits_context = False
        if max_kv_bytes is not None:
            fits = max_kv_bytes // self.kv_bytes_per_token - 2  # the columns past the context: trash and growth
            if fits < 64:
                raise ConfigError(f"max_kv_bytes={max_kv_bytes} holds {max(fits, 0)} tokens per sequence at "
                                  f"max_batch_size={max_batch_size} ({self.kv_bytes_per_token} bytes a token); "
                                  "raise it or lower max_batch_size", what="engine")
            self.kv_budget_limits_context = fits < self.context_length
            self.context_length = min(self.context_length, fits)
        # Steps run on the process's compute thread (groupwise/runtime/compute.py says why one thread), and so
        # does every torch op of the engine's, allocations included (a large fill is an OpenMP region).
        self._compute = compute_thread()
        buffers = self._compute.call(SlotBuffers, text_config.num_hidden_layers, max_batch_size, kv_heads,
                                     head_dim, min(initial_capacity, self.context_length), dtype,
                                     device, max_capacity=self.context_length + 2)
        # Stop at the tokens groupwise decided from the model's files (eos and the chat template's end
        # of turn), never only at the tokenizer's eos: transformers' conversions disagree on it.
        eos = set(special_tokens(tokenizer).stop_ids)
        for source in (getattr(getattr(base, "generation_config", None), "eos_token_id", None),):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, (list, tuple)):
                eos.update(int(t) for t in source)
        self.state = StepState(
            tokenizer=tokenizer, buffers=buffers,
            # KV of prompt prefixes seen before (prefix_cache.py); allocated at the first prefill.
            prefix_cache=PrefixCache(buffers, prefix_cache_tokens, prefix_block_size) if prefix_cache_tokens else None,
            max_batch_size=max_batch_size, max_prefill_tokens=max_prefill_tokens, context_length=self.context_length,
            eos_token_ids=eos, device=device, stats=stats, batch_invariant=batch_invariant,
            cv=self._compute.cv,  # guards the queues; submit() wakes the compute thread through it
            # Each admission is priced: a batch that would not fit waits or is refused (batch_memory.py).
            memory=BatchMemory(text_config, dtype=dtype, device=device, max_prefill_tokens=max_prefill_tokens,
                               limit=memory_limit_bytes))
        self._adapters: dict[str, str] = {}
        # Held by the loop for one step, and by add/remove_adapter. A pause does not hold it: it
        # counts pauses (the loop starts no step while > 0) and waits for the current step to end,
        # so the trainer may load an adapter from inside a pause without deadlocking.
        self._step_lock = threading.RLock()
        self.release_when_idle = release_when_idle
        self._released_capacity = 0  # KV capacity freed during a pause, restored at its end
        self._compute.attach(self)

    # ---------------------------------------------------------------- what the engine is made of
    @property
    def model(self) -> Any:
        """The served model: a peft `PeftModel` once an adapter is loaded (the backend shares it)."""
        return self.runner.model

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runner.dtype

    @property
    def buffers(self) -> SlotBuffers:
        return self.state.buffers

    @property
    def prefix_cache(self) -> PrefixCache | None:
        return self.state.prefix_cache

    @property
    def eos_token_ids(self) -> set[int]:
        return self.state.eos_token_ids

    @property
    def cuda_graphs(self) -> bool:
        """Decode by CUDA graph replay (turned off for good if a capture fails)."""
        return self.runner.cuda_graphs

    @property
    def closed(self) -> bool:
        """Closed: takes no request any more (the server's liveness probe reads it)."""
        return self.state.closed

    @property
    def stats(self) -> EngineStats:
        return self.state.stats

    # ---------------------------------------------------------------- adapters and the model lock
    def add_adapter(self, name: str, path: str | None = None, *, weights: dict[str, Any] | None = None,
                    config: Any = None) -> None:
        """Load a peft LoRA adapter as `name` (a trained step's is its served name ``agent@3``,
        adapter_names.py): the folder `path`, or `weights` (peft's state dict of the adapter) with its
        peft `config`. Several stay resident; requests choose per call. Its weights go to a free slot of
        the same LoRA shape when there is one (adapter_slots.py)."""
        if name == BASE or name.startswith(SLOT_PREFIX):
            raise EngineError(f"adapter name {name!r} is reserved; pick another")
        self._compute.call(self._add_adapter, name, path, weights, config)

    def _add_adapter(self, name: str, path: str | None, weights: dict[str, Any] | None, config: Any) -> None:
        path = None if path is None else str(path)
        with self._no_update(lambda: not self.runner.slots.has_free(self.runner, path, config)):
            if name in self._adapters or (self.runner.is_peft() and name in self.model.peft_config):
                raise EngineError(f"adapter {name!r} is already loaded; remove_adapter({name!r}) first")
            if self.runner.slots.load(self.runner, name, path, weights=weights, config=config):
                self._eval_mode()  # a new slot's modules (not for a refilled slot)
            self._adapters[name] = str(path) if path is not None else "<memory>"
            self._weights_changed()  # a reused name (or slot) must not find the old weights' KV

    @contextlib.contextmanager
    def _no_update(self, changes_modules: Callable[[], bool]) -> Iterator[None]:
        """The step lock, taken where no trainer updates beside the engine (`paused(decoding=True)`) if
        `changes_modules()`: a new adapter slot adds modules to the model the trainer is running and sets
        them all to eval mode. The wait is outside the step lock, which the update's end takes."""
        while True:
            with self._step_lock:
                if not (self.state.replays_only and changes_modules()):
                    yield
                    return
            with self.state.cv:
                self.state.cv.wait_for(lambda: not self.state.replays_only)

    def _eval_mode(self) -> None:
        """``model.eval()`` on the runner's cached module list (module_walk.py): at every update's pause end it
        runs while the pause holds the step lock the next run's update waits for."""
        set_training(self.runner.walk(self.model)[0], False)

    def reserve_slots(self, n: int, *, weights: dict[str, Any], config: Any) -> None:
        """Make `n` free adapter slots of the shape of `weights` / `config` (adapter_slots.py) now, before
        the adapters that will fill them are trained."""
        self._compute.call(self._reserve_slots, n, weights, config)

    def _reserve_slots(self, n: int, weights: dict[str, Any], config: Any) -> None:
        with self._no_update(lambda: n > 0):
            self.runner.slots.reserve(self.runner, n, weights=weights, config=config)
            self._eval_mode()
            self._weights_changed()

    def remove_adapter(self, name: str) -> None:
        self._compute.call(self._remove_adapter, name)

    def _remove_adapter(self, name: str) -> None:
        with self._step_lock:
            if name not in self._adapters:
                raise EngineError(f"adapter {name!r} is not loaded; loaded: {sorted(self._adapters)}")
            # peft's mixed-batch forward silently skips an unknown adapter (the base model would
            # answer in its place), so an adapter still asked for must not disappear.
            with self.state.cv:
                busy = any(s.req.adapter == name for s in self.state.running) or any(
                    st.req.adapter == name for st in self.state.waiting)
            if busy:
                raise EngineError(f"adapter {name!r} is serving queued or running requests; retry when they finish")
            # The slot keeps its tensors (and its CUDA graphs) for the next adapter of its shape.
            self.runner.slots.release(name)
            del self._adapters[name]
            self._weights_changed()

    def retarget(self, follow: str, adapter: str) -> int:
        """Move every queued and running request that follows model `follow`'s latest policy
        (`GenerationRequest.follow`) to `adapter`, its new latest step; returns how many moved.

        Partial rollouts: a running sequence goes on under the new adapter from its next token, with
        the KV of its earlier tokens as the old adapter computed them (recomputing it would cost a
        prefill per row, and the old adapter's KV is what its tokens were sampled from). Each token
        records the adapter that sampled it (`Completion.adapters`), so the trainer knows its
        behaviour policy. The move happens between two engine steps (under the step lock)."""
        if not self._known_adapter(adapter):
            raise EngineError(f"adapter {adapter!r} is not loaded; loaded: {self.adapters()}")
        return self._compute.call(self._retarget, follow, adapter)

    def _retarget(self, follow: str, adapter: str) -> int:
        with self._step_lock, self.state.cv:
            requests = {id(st): st.req for st in (*self.state.waiting, *self.state.admitted)}
            requests.update({id(s.state): s.req for s in self.state.running})
            moved = [r for r in requests.values() if r.follow == follow and r.adapter != adapter]
            for r in moved:
                r.adapter = adapter
            return len(moved)

    def peft_adapter_name(self, name: str) -> str:
        """The peft adapter (slot) holding the weights served as `name`."""
        return self.runner.peft_name(name)

    def adapter_parameters(self, name: str) -> dict[str, Any]:
        """The tensors served as `name`, by the keys of peft's state dict (adapter_slots.py)."""
        return self.runner.slots.parameters(self.model, self.peft_adapter_name(name))

    def adapters(self) -> list[str]:
        """Adapters the engine loaded (peft adapters the caller made itself are usable too)."""
        return sorted(self._adapters)

    def _known_adapter(self, name: str) -> bool:
        return name in self._adapters or self.runner.has_adapter(name)

    def _weights_changed(self) -> None:
        """Adapter weights may differ now: cached prefixes and a merged adapter (merged.py) go, and the
        stacked slot adapters (stacked_lora.py) are refilled before their next pass."""
        self.state.forget_prefixes()
        if self.runner.merged is not None:
            self.runner.merged.invalidate()
        if self.runner.stacked is not None:
            self.runner.stacked.invalidate()

    def _pause_begin(self, decoding: bool = False) -> bool:
        """Begin a pause; returns whether it lets replays go on (`paused`): not where the engine is idle and
        its memory goes to the update (`_release_idle_memory`), which then runs beside a whole pause."""
        with self.state.cv:
            if decoding:
                self.state.replays_only += 1
            else:
                self.state.pauses += 1
        self._note_stall()
        with self._step_lock:  # wait for a step in progress (it hands back: wanted_elsewhere); later steps see the pause
            with self.state.cv:
                if decoding and self._idle_memory_wanted():
                    self.state.replays_only -= 1
                    self.state.pauses += 1
                    decoding = False
                elif decoding:
                    self.state.replays_begun += 1
                self.state.cv.notify_all()
            if not decoding:
                self._release_idle_memory()
        return decoding

    def _release_idle_memory(self) -> None:
        """With no sequence in the slots, free what a pause makes useless: the merged copy and the prefix
        cache (both dropped at the pause's end anyway) and the slot KV buffers (allocated again at the
        end). A pause is where the trainer runs, and its backward is a run's memory peak: SmolLM2 in fp32
        serves from ~0.4 GB of merged weights, ~0.2 GB of prefixes and 0.4-0.8 GB of KV on the CPU, and a
        7B step's 64 slots and prefixes hold ~1.1 GB on a GPU, the whole gap between its update's peak and
        TRL's. On CUDA the decode graphs read the buffers by address, so they go too, and each is captured
        again when its bucket is next decoded: with 4 runs of a 0.5B model on one H200 that cost 16-22% of
        the tokens/s (15 captures in 3 steps against 7). So by default (`release_when_idle=None`) the CPU
        always releases, and CUDA only under memory pressure (`memory_pressed`); True or False decides."""
        if not self._idle_memory_wanted():
            return
        st = self.state
        self._weights_changed()
        self.runner.graphs.clear()
        if st.prefix_cache is not None:
            st.prefix_cache.release()
        self._released_capacity = st.buffers.release()

    def _idle_memory_wanted(self) -> bool:
        """Whether a pause beginning now frees the engine's memory (`_release_idle_memory`)."""
        st = self.state
        if st.running or st.admitted or self._released_capacity:
            return False
        if self.release_when_idle is not None:
            return self.release_when_idle
        return self.device.type == "cpu" or memory_pressed(self.device)

    def _pause_end(self, decoding: bool = False) -> None:
        restore = 0
        with self._step_lock:
            self._eval_mode()  # the trainer may have left it in train mode (dropout)
            self._weights_changed()  # ... and changed an adapter's weights in place
            if decoding:
                with self.state.cv:
                    self.state.replays_only -= 1
                    self.state.replays_begun -= 1
                    self.state.replays_blocked = False
                    self.state.cv.notify_all()
                self._note_stall()
                return
            if self._released_capacity and self.state.pauses == 1:  # the last pause restores the KV
                restore, self._released_capacity = self._released_capacity, 0
        if restore:
            # On the compute thread (a large fill is an OpenMP region), and outside the step lock: the
            # compute thread may be waiting for that lock, and it finds the engine still paused.
            self._compute.call(self.state.buffers.restore, restore)
        with self.state.cv:
            self.state.pauses -= 1
            self.state.cv.notify_all()
        self._note_stall()

    def paused(self, *, decoding: bool = False) -> "_Paused":
        """``with engine.paused():`` or ``async with``: no forward pass runs until released, so the
        trainer can use the shared model exclusively. Running requests resume afterwards.

        ``decoding=True`` (honoured where `decode_during_updates`): the running requests go on meanwhile, by
        graph replays only (decode.py): no prefill, capture or eager pass, which would run the modules whose
        flags and forwards the trainer sets; a step that needs one waits for the end. The trainer then runs
        on a thread of its own (runtime/compute.py's `update_thread`: the compute thread steps this engine),
        and the KV stays (the graphs read it). No adapter slot is made meanwhile (`_add_adapter`). An idle
        engine whose memory the update wants (`_release_idle_memory`: a 7B step's peak) pauses whole instead."""
        return _Paused(self, decoding and self.decode_during_updates)

    # ---------------------------------------------------------------- submitting
    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Thread-safe: queue a request; the future resolves to a `GenerationResult`."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._validate(request)
        if self.state.closed:
            raise EngineError("the engine is closed")
        prompt_len = len(request.prompt_ids)
        limit = request.max_new_tokens if request.max_new_tokens is not None else self.max_new_tokens_default
        # Clamp to the context (vLLM would refuse; rollouts prefer a shorter answer to an error).
        max_new = max(1, min(limit, self.context_length - prompt_len))
        state = RequestState(request, future, max_new)
        memory = self.state.memory
        if memory is not None and memory.limit is not None:
            # A fixed limit: a request that exceeds it alone in an idle engine is refused here, to the caller
            # (admission refuses it too, where the room is the device's free memory and known only then).
            price = self.state.price([state], alone=True)
            if price.total > memory.limit:
                raise memory.refusal(price, memory.limit, prompt=prompt_len, max_new=max_new)
        future.add_done_callback(self._on_done)
        for i in range(request.n):
            seq = SeqState(request, state, i)
            if request.sampling.seed is not None:
                seq.seed = request.sampling.seed + i  # choice i of n draws its own stream
            if request.constraint is not None:
                seq.matcher = request.constraint.new_matcher()
            state.seqs.append(seq)
        with self.state.cv:
            self.state.waiting.append(state)
            self.state.cv.notify_all()
        self._note_stall()
        return future

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await asyncio.wrap_future(self.submit(request))

    def _on_done(self, future: concurrent.futures.Future) -> None:
        """A caller cancelled its future (the server does when a client goes away): stop its work."""
        if future.cancelled():
            with self.state.cv:
                self.state.cancel_pending = True
                self.state.cv.notify_all()

    def _validate(self, r: GenerationRequest) -> None:
        check_request(r, vocab_size=self.vocab_size, context_length=self.context_length,
                      max_batch_size=self.max_batch_size, kv_budget_limits_context=self.kv_budget_limits_context,
                      known_adapter=self._known_adapter, adapters=self.adapters)

    # ---------------------------------------------------------------- the loop (compute.py steps it)
    def ready(self) -> bool:
        """Called by the compute thread under the queues' condition: is there a step to run?"""
        st = self.state
        if st.closed or st.pauses:
            return False
        if st.replays_only:  # none while an update begins: it waits for the step lock, which this thread would keep
            return st.replays_only == st.replays_begun and (bool(st.running) and not st.replays_blocked or st.cancel_pending)
        return bool(st.waiting or st.running)

    def poll(self) -> None:
        """One step (admit + prefill, then decode), run by the compute thread."""
        try:
            with self._step_lock:
                with self.state.cv:
                    if not self.ready():  # a pause began (or the engine closed) since the check
                        return
                self._step()
        except BaseException as exc:  # not traced to one request (prefill.py, decode.py isolate those)
            self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        st = self.state
        with st.cv:
            states = (st.admitted + list(st.waiting) + list({id(s.state): s.state for s in st.running}.values()))
            st.admitted = []
            st.waiting.clear()
            st.running = []
        for request in states:
            request.settle(error=EngineError(f"generation failed: {type(exc).__name__}: {exc}"))
        self._note_stall()

    def _sweep_cancelled(self) -> None:
        """Drop requests whose callers cancelled: waiting ones leave the queue, running rows retire."""
        st = self.state
        with st.cv:
            if not st.cancel_pending:
                return
            st.cancel_pending = False
            kept = [r for r in st.waiting if not r.future.cancelled()]
            st.stats.cancelled_requests += len(st.waiting) - len(kept)
            st.waiting = deque(kept)
        gone = {id(s.state): s.state for s in st.running if s.state.future.cancelled() and not s.finish_reason}
        for request in gone.values():
            for s in request.seqs:
                s.finish_reason = "cancelled"
        st.stats.cancelled_requests += len(gone)
        if gone:
            retire(st)

    def _step(self) -> None:
        self._sweep_cancelled()
        if self.state.replays_only:  # a trainer updates meanwhile: replays only (`paused`)
            if self.state.running:
                t0 = time.perf_counter()
                stepped = decode(self.state, self.runner, replays_only=True)
                took = time.perf_counter() - t0
                self.stats.decode_s += took
                self.stats.decode_s_in_updates += took
                if not stepped:
                    with self.state.cv:
                        self.state.replays_blocked = True
            self._note_stall()
            return
        admitted = admit(self.state)
        if admitted:
            # Admitted requests are in neither queue until placed: _fail_all must see them too, or
            # a failing prefill would leave their callers waiting forever.
            self.state.admitted = admitted
            t0 = time.perf_counter()
            prefill_isolated(self.state, self.runner, admitted)
            self.stats.prefill_s += time.perf_counter() - t0
            self.state.admitted = []
        if self.state.running:
            t0 = time.perf_counter()
            decode(self.state, self.runner)
            self.stats.decode_s += time.perf_counter() - t0
        self._note_stall()

    def _note_stall(self) -> None:
        """Tell the rollout clock (rollout/stalls.py) whether this engine's callers wait through no fault
        of their own: paused (a trainer has the model) with requests in flight, or holding a request
        that the free slots (or the engine's memory, batch_memory.py) cannot take. Their rollouts' timeouts do
        not count that time."""
        st = self.state
        with st.cv:
            in_flight = bool(st.waiting or st.running or st.admitted)
            full = bool(st.waiting) and (st.waiting[0].req.n > st.max_batch_size - len(st.running) or st.held_for_memory)
            # while a trainer updates, what waits for a prefill, or for a step that is not a replay, is held too
            held = st.replays_only > 0 and bool(st.waiting or st.admitted or (st.replays_blocked and st.running))
            stalled = not st.closed and ((st.pauses > 0 and in_flight) or full or held)
        STALLS.set_stalled(self, stalled)

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        with self.state.cv:
            self.state.closed = True
            self.state.cv.notify_all()
        self._compute.detach(self)
        with self._step_lock:  # a step in progress ends first
            # The graphs go now, outside any capture: left to the garbage collector, a cycle holding them
            # could be collected while another engine of the process captures (decode_graphs.py).
            self.runner.graphs.clear()
        self._fail_all(EngineError("the engine was closed"))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Paused:
    """A pause of the engine's forward passes: ``with`` or ``async with`` (waits off the event loop).
    `decoding`: the running requests go on by graph replays (`Engine.paused`)."""

    def __init__(self, engine: Engine, decoding: bool = False):
        self._engine, self.decoding = engine, decoding

    def __enter__(self):
        self.decoding = self._engine._pause_begin(self.decoding)
        return self._engine

    def __exit__(self, *exc):
        self._engine._pause_end(self.decoding)

    async def __aenter__(self):
        self.decoding = await asyncio.get_running_loop().run_in_executor(None, self._engine._pause_begin, self.decoding)
        return self._engine

    async def __aexit__(self, *exc):
        await asyncio.get_running_loop().run_in_executor(None, self._engine._pause_end, self.decoding)
