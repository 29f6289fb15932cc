"""The batching generation engine: continuous batching on transformers, per-request LoRA, logprobs.

How it runs. Rollouts are asyncio coroutines; the engine is stepped by the process's compute thread
(groupwise/compute.py: one thread for all torch work, which the CPU's OpenMP needs to run at full
speed) and answers through futures (`await engine.generate(request)` works from any event loop).
Each step, under the model lock:

1. prefill (prefill.py): waiting requests are admitted while slots are free; their prompts' known
   prefixes are copied from the prefix cache (prefix_cache.py), the rest (left-padded, one row per
   request even when n > 1) runs in ONE forward pass, and each choice samples its first token; the
   prompt's KV is copied to the slots of the other choices of the same request.
2. decode (decode.py): every running sequence feeds its last token in ONE forward pass ([k, 1]
   inputs); tokens are sampled, stops checked, finished rows retired and their callers answered.

Requests thus join and leave the running batch at token granularity. The KV cache is a
preallocated slot cache (kv_cache.py): slot i holds sequence i's keys/values at columns
0..length-1, running sequences are kept in slots 0..k-1 (a finished one's slot is refilled by
moving the last one down), and attention reads columns [0, length) through a 4-D mask.

Adapters. The model is a transformers causal LM or a peft `PeftModel` (the backend shares one base
model between engine and trainer). Each request names an adapter or the base (None); a batch mixing
several is served in one forward through peft's ``adapter_names=[...]`` kwarg (``"__base__"`` for
the base model). That kwarg only changes the Linear layers, so it composes with the KV cache
(tests/inference check a mixed batch against separate runs).

CUDA. The decode step on CUDA replays CUDA graphs captured per (batch bucket, attention-length
bucket, adapter) when every row of the batch uses the same adapter (peft's mixed-batch path
indexes with Python lists, which graphs cannot capture; mixed batches run eagerly). The slot
buffers never move, so graphs stay valid until the cache grows or an adapter is removed. Where no
row needs top-p, a grammar or top_logprobs, the graph samples too and computes its next inputs,
so the next step is launched before the CPU reads this one's tokens (decode_graphs.py). Decode
attention reads each K/V head once for its group of query heads (attention.py).

CPU. A batch whose rows share one adapter runs from merged weights (merged.py): on the CPU a
LoRA layer's tiny matmuls cost their overhead, not their FLOPs. fp32 linears run through oneDNN
for the engine's passes (cpu_linear.py): the same products as MKL's sgemm, 1.3-2x faster here.

Logprobs are the model's raw log-softmax (sampling.py says why).

Why not transformers' own continuous batching (``generate_batch`` / ``init_continuous_batching``,
paged attention, in transformers 5): looked at in 5.24, it returns logprobs and takes per-request
logits-processor kwargs, but has no per-request LoRA adapter (one of our requirements: every
rollout names its step), no grammar masks per request, and its scheduler owns the model, which we
share with the trainer (`paused()`). The slot cache here is small enough to own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import threading
from collections import deque
from typing import Any

import torch

from groupwise.compute import compute_thread
from groupwise.inference.adapter_slots import SLOT_PREFIX, AdapterSlots
from groupwise.inference.attention import engine_attention
from groupwise.inference.cpu_linear import OneDNNLinears, onednn_linear_available
from groupwise.inference.decode import decode, retire
from groupwise.inference.kv_cache import SlotBuffers
from groupwise.inference.merged import MergedAdapter
from groupwise.inference.prefill import admit, prefill_isolated
from groupwise.inference.prefix_cache import PrefixCache
from groupwise.inference.requests import (BASE, Completion, EngineError, GenerationRequest, GenerationResult,
                                          PromptTooLongError, RequestFailedError, _ReqState, _Seq)
from groupwise.module_walk import ModuleWalk

__all__ = ["Completion", "Engine", "EngineError", "GenerationRequest", "GenerationResult", "PromptTooLongError",
           "RequestFailedError"]


class Engine:
    """Continuous-batching generation over one (possibly peft-wrapped) model. See the module doc."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 32,
        max_new_tokens_default: int = 256,
        max_seq_len: int | None = None,
        max_prefill_tokens: int = 8192,
        initial_capacity: int = 256,
        cuda_graphs: bool | None = None,
        prefix_cache_tokens: int = 4096,  # KV of this many prompt tokens kept for reuse; 0 turns it off
        prefix_block_size: int = 16,  # its allocation unit (hits are still token-exact)
        merge_adapters: bool | None = None,  # serve a one-adapter batch from merged weights (merged.py); default: on CPU
        onednn_linear: bool | None = None,  # fp32 CPU linears through oneDNN (cpu_linear.py); default: where available
        max_kv_bytes: int | None = None,  # the slot cache's largest size: the context shrinks to what fits
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.max_new_tokens_default = max_new_tokens_default
        self.max_prefill_tokens = max_prefill_tokens
        config = self._base_model().config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.context_length = int(max_seq_len or getattr(text_config, "max_position_embeddings", 4096))
        self.vocab_size = int(self._base_model().get_input_embeddings().num_embeddings)  # valid ids: [0, this)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        heads = text_config.num_attention_heads
        head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
        kv_heads = getattr(text_config, "num_key_value_heads", None) or heads
        # The slot cache holds max_batch_size rows of the whole context (kv_cache.py): bounded by
        # max_kv_bytes, one long prompt cannot make it outgrow the machine's memory.
        self.kv_bytes_per_token = 2 * text_config.num_hidden_layers * max_batch_size * kv_heads * head_dim * (
            torch.empty((), dtype=self.dtype).element_size())
        self.kv_budget_limits_context = False
        if max_kv_bytes is not None:
            fits = max_kv_bytes // self.kv_bytes_per_token - 2  # the columns past the context: trash and growth
            if fits < 64:
                from groupwise.errors import ConfigError

                raise ConfigError(f"max_kv_bytes={max_kv_bytes} holds {max(fits, 0)} tokens per sequence at "
                                  f"max_batch_size={max_batch_size} ({self.kv_bytes_per_token} bytes a token); "
                                  "raise it or lower max_batch_size", what="engine")
            self.kv_budget_limits_context = fits < self.context_length
            self.context_length = min(self.context_length, fits)
        # Steps run on the process's compute thread (groupwise/compute.py says why one thread), and so
        # does every torch op of the engine's, allocations included (a large fill is an OpenMP region).
        self._compute = compute_thread()
        self.buffers = self._compute.call(SlotBuffers, text_config.num_hidden_layers, max_batch_size, kv_heads,
                                          head_dim, min(initial_capacity, self.context_length), self.dtype,
                                          self.device, max_capacity=self.context_length + 2)
        # KV of prompt prefixes seen before (prefix_cache.py); allocated at the first prefill.
        self.prefix_cache = (PrefixCache(self.buffers, prefix_cache_tokens, prefix_block_size)
                             if prefix_cache_tokens else None)
        eos = set()
        for source in (getattr(tokenizer, "eos_token_id", None),
                       getattr(getattr(self._base_model(), "generation_config", None), "eos_token_id", None)):
            if isinstance(source, int):
                eos.add(source)
            elif isinstance(source, (list, tuple)):
                eos.update(int(t) for t in source)
        self.eos_token_ids = eos
        # transformers 5 renamed the forward kwarg past_key_values -> cache.
        params = inspect.signature(self._base_model().forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.cuda_graphs = (self.device.type == "cuda") if cuda_graphs is None else cuda_graphs
        self._graphs: dict[tuple, dict[str, Any]] = {}
        self._walk = ModuleWalk()
        self._slots = AdapterSlots()
        merge = (self.device.type == "cpu") if merge_adapters is None else merge_adapters
        self._merged = MergedAdapter() if merge else None
        if onednn_linear and not onednn_linear_available():
            raise ValueError("onednn_linear=True, but this PyTorch build has no oneDNN linear "
                             "(torch.backends.mkldnn); leave it None to use it only where available")
        onednn = onednn_linear_available() if onednn_linear is None else onednn_linear
        cpu_fp32 = self.device.type == "cpu" and self.dtype == torch.float32
        self._onednn = OneDNNLinears() if onednn and cpu_fp32 else None
        self._graph_pool = None
        self.forward_passes = 0
        self.prefill_passes = 0
        self.decode_passes = 0
        self.warm_passes = 0  # prefills of prefixes shared inside one admitted batch (prefill.py)
        self.prefill_tokens = 0  # prompt tokens run through the model (pads excluded)
        self.prefix_hit_tokens = 0  # prompt tokens copied from the prefix cache instead
        self.cancelled_requests = 0  # dropped because their caller cancelled (a client went away)
        self.failed_requests = 0  # failed alone: a step error was traced to them, the others went on
        self._cancel_pending = False  # a caller cancelled since the last sweep (_sweep_cancelled)
        self._adapters: dict[str, str] = {}
        self._waiting: deque[_ReqState] = deque()
        self._admitted: list[_ReqState] = []  # taken from _waiting, being prefilled
        self._running: list[_Seq] = []  # index i lives in slot i
        self._cv = self._compute.cv  # guards the queues; submit() wakes the compute thread through it
        # Held by the loop for one step, and by add/remove_adapter. A pause does not hold it: it
        # counts pauses (the loop starts no step while > 0) and waits for the current step to end,
        # so the trainer may load an adapter from inside a pause without deadlocking.
        self._step_lock = threading.RLock()
        self._pauses = 0
        self._closed = False
        self._default_generator = torch.Generator(device=self.device)
        self._default_generator.manual_seed(0)
        self._cpu_generator = torch.Generator().manual_seed(0)  # seeds of unseeded rows in graph sampling
        self._compute.attach(self)

    # ---------------------------------------------------------------- adapters and the model lock
    def _base_model(self) -> Any:
        return self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model

    def _is_peft(self) -> bool:
        return hasattr(self.model, "peft_config")

    def add_adapter(self, name: str, path: str) -> None:
        """Load a peft LoRA adapter folder as `name`; several stay resident; requests choose per call.
        Its weights go to a free slot of the same LoRA shape when there is one (adapter_slots.py)."""
        if name == BASE or "@" in name or name.startswith(SLOT_PREFIX):
            raise EngineError(f"adapter name {name!r} is reserved; pick another")
        self._compute.call(self._add_adapter, name, path)

    def _add_adapter(self, name: str, path: str) -> None:
        with self._step_lock:
            if name in self._adapters or (self._is_peft() and name in self.model.peft_config):
                raise EngineError(f"adapter {name!r} is already loaded; remove_adapter({name!r}) first")
            self._slots.load(self, name, str(path))
            self.model.eval()
            self._adapters[name] = str(path)
            self._weights_changed()  # a reused name (or slot) must not find the old weights' KV

    def remove_adapter(self, name: str) -> None:
        self._compute.call(self._remove_adapter, name)

    def _remove_adapter(self, name: str) -> None:
        with self._step_lock:
            if name not in self._adapters:
                raise EngineError(f"adapter {name!r} is not loaded; loaded: {sorted(self._adapters)}")
            # peft's mixed-batch forward silently skips an unknown adapter (the base model would
            # answer in its place), so an adapter still asked for must not disappear.
            with self._cv:
                busy = any(s.req.adapter == name for s in self._running) or any(
                    st.req.adapter == name for st in self._waiting)
            if busy:
                raise EngineError(f"adapter {name!r} is serving queued or running requests; retry when they finish")
            # The slot keeps its tensors (and its CUDA graphs) for the next adapter of its shape.
            self._slots.release(name)
            del self._adapters[name]
            self._weights_changed()

    def peft_adapter_name(self, name: str) -> str:
        """The peft adapter (slot) holding the weights served as `name`."""
        return self._slots.peft_name(name)

    def adapters(self) -> list[str]:
        """Adapters the engine loaded (peft adapters the caller made itself are usable too)."""
        return sorted(self._adapters)

    def _known_adapter(self, name: str) -> bool:
        return name in self._adapters or (
            self._is_peft() and name in self.model.peft_config and not name.startswith(SLOT_PREFIX))

    def _forget_prefixes(self) -> None:
        """Cached prefix KV is only valid for the weights that made it (prefix_cache.py)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _weights_changed(self) -> None:
        """Adapter weights may differ now: cached prefixes and a merged adapter (merged.py) go."""
        self._forget_prefixes()
        if self._merged is not None:
            self._merged.invalidate()

    def _pause_begin(self) -> None:
        with self._cv:
            self._pauses += 1
        with self._step_lock:  # wait for a step in progress; later steps see the pause
            pass

    def _pause_end(self) -> None:
        with self._step_lock:
            self.model.eval()  # the trainer may have left it in train mode (dropout)
            self._weights_changed()  # ... and changed an adapter's weights in place
        with self._cv:
            self._pauses -= 1
            self._cv.notify_all()

    def paused(self) -> "_Paused":
        """``with engine.paused():`` or ``async with``: no forward pass runs until released, so the
        trainer can use the shared model exclusively. Running requests resume afterwards."""
        return _Paused(self)

    # ---------------------------------------------------------------- submitting
    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        """Thread-safe: queue a request; the future resolves to a `GenerationResult`."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._validate(request)
        if self._closed:
            raise EngineError("the engine is closed")
        prompt_len = len(request.prompt_ids)
        limit = request.max_new_tokens if request.max_new_tokens is not None else self.max_new_tokens_default
        # Clamp to the context (vLLM would refuse; rollouts prefer a shorter answer to an error).
        max_new = max(1, min(limit, self.context_length - prompt_len))
        state = _ReqState(request, future, max_new)
        future.add_done_callback(self._on_done)
        for i in range(request.n):
            seq = _Seq(request, state, i)
            if request.sampling.seed is not None:
                seq.seed = request.sampling.seed + i  # choice i of n draws its own stream
            if request.constraint is not None:
                seq.matcher = request.constraint.new_matcher()
            state.seqs.append(seq)
        with self._cv:
            self._waiting.append(state)
            self._cv.notify_all()
        return future

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await asyncio.wrap_future(self.submit(request))

    def _on_done(self, future: concurrent.futures.Future) -> None:
        """A caller cancelled its future (the server does when a client goes away): stop its work."""
        if future.cancelled():
            with self._cv:
                self._cancel_pending = True
                self._cv.notify_all()

    def _validate(self, r: GenerationRequest) -> None:
        # Everything a batch would choke on is refused here, before the request can share a forward
        # pass with others: out-of-range ids index the embedding, an int64-overflowing seed the sampler.
        problems = r.sampling.problems(r.n)
        if not r.prompt_ids:
            problems.append("the prompt is empty")
        for what, ids in (("prompt", r.prompt_ids), ("stop_token_ids", r.stop_token_ids)):
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size]
            if bad:
                problems.append(f"{what} has token ids outside [0, {self.vocab_size}) (the vocabulary): {bad[:5]}")
        if len(r.prompt_ids) >= self.context_length:
            why = (f" (what the KV cache budget holds at {self.max_batch_size} sequences)"
                   if self.kv_budget_limits_context else "")
            raise PromptTooLongError(
                f"the prompt has {len(r.prompt_ids)} tokens but the context length is "
                f"{self.context_length}{why}; shorten the conversation (or drop old turns)"
            )
        if r.max_new_tokens is not None and r.max_new_tokens < 1:
            problems.append(f"max_new_tokens={r.max_new_tokens} must be >= 1")
        if not (1 <= r.n <= self.max_batch_size):
            problems.append(f"n={r.n} must be in [1, max_batch_size={self.max_batch_size}]")
        if r.adapter not in (None, BASE) and not self._known_adapter(r.adapter):
            problems.append(f"adapter {r.adapter!r} is not loaded; loaded: {self.adapters()}")
        if problems:
            raise EngineError("; ".join(problems))

    # ---------------------------------------------------------------- the loop
    def _ready(self) -> bool:
        """Called by the compute thread under `_cv`: is there a step to run?"""
        return not self._closed and not self._pauses and bool(self._waiting or self._running)

    def _poll(self) -> None:
        """One step (admit + prefill, then decode), run by the compute thread."""
        try:
            with self._step_lock:
                with self._cv:
                    if not self._ready():  # a pause began (or the engine closed) since the check
                        return
                self._step()
        except BaseException as exc:  # not traced to one request (prefill.py, decode.py isolate those)
            self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        with self._cv:
            states = (self._admitted + list(self._waiting)
                      + list({id(s.state): s.state for s in self._running}.values()))
            self._admitted = []
            self._waiting.clear()
            self._running = []
        for st in states:
            st.settle(error=EngineError(f"generation failed: {type(exc).__name__}: {exc}"))

    def _fail_request(self, st: _ReqState, exc: BaseException) -> None:
        """Fail one request whose error was traced to it; its running rows are retired by the caller."""
        self.failed_requests += 1
        st.fail(exc)

    def _sweep_cancelled(self) -> None:
        """Drop requests whose callers cancelled: waiting ones leave the queue, running rows retire."""
        with self._cv:
            if not self._cancel_pending:
                return
            self._cancel_pending = False
            kept = [st for st in self._waiting if not st.future.cancelled()]
            self.cancelled_requests += len(self._waiting) - len(kept)
            self._waiting = deque(kept)
        gone = {id(s.state): s.state for s in self._running if s.state.future.cancelled() and not s.finish_reason}
        for st in gone.values():
            for s in st.seqs:
                s.finish_reason = "cancelled"
        self.cancelled_requests += len(gone)
        if gone:
            retire(self)

    def _step(self) -> None:
        self._sweep_cancelled()
        admitted = admit(self)
        if admitted:
            # Admitted requests are in neither queue until placed: _fail_all must see them too, or
            # a failing prefill would leave their callers waiting forever.
            self._admitted = admitted
            prefill_isolated(self, admitted)
            self._admitted = []
        if self._running:
            decode(self)

    def _adapter_names(self, seqs: list[_Seq]) -> list[str] | None:
        if not self._is_peft():
            return None
        return [self._slots.peft_name(s.req.adapter or BASE) for s in seqs]

    def _one_adapter(self, name: str | None) -> Any:
        """The context in which the model computes adapter `name` (None/BASE: the base) for every row:
        merged weights where that applies (merged.py), else peft's layers with `name` active."""
        from groupwise.inference.decode_graphs import adapter_ctx

        if self._merged is not None and name not in (None, BASE) and self._is_peft():
            layers = self._tuner_layers()
            if self._merged.usable(layers, name):
                return self._merged_serving(layers, name)
        return adapter_ctx(self, name)

    @contextlib.contextmanager
    def _merged_serving(self, layers: list[Any], name: str):
        from groupwise.inference.decode_graphs import adapter_ctx

        with adapter_ctx(self, BASE), self._merged.serving(layers, name):  # peft's layers off: the weights carry it
            yield

    def _forward(self, input_ids, position_ids, mask, cache, adapter_names, logits_to_keep=None):
        kwargs: dict[str, Any] = {self._cache_kwarg: cache, "use_cache": True}
        one_adapter = contextlib.nullcontext()
        if adapter_names is not None:
            if len(set(adapter_names)) == 1:
                # Every row uses one adapter (the usual rollout batch): make it the active one
                # instead of peft's mixed-batch path, which splits and re-scatters the batch in
                # every adapted layer (measured on CPU, SmolLM2, 8 rows: 210 ms a decode step with
                # adapter_names, 120 ms without an adapter).
                one_adapter = self._one_adapter(adapter_names[0])
            else:
                kwargs["adapter_names"] = adapter_names
        if logits_to_keep is not None:
            kwargs["logits_to_keep"] = logits_to_keep
        self.forward_passes += 1
        linears = self._onednn.installed(self._walk(self.model)[0]) if self._onednn else contextlib.nullcontext()
        with torch.inference_mode(), one_adapter, engine_attention(self._base_model().config), linears:
            out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, **kwargs)
        return out.logits

    def _tuner_layers(self) -> list[Any]:
        """peft's adapted layers (module_walk.py: walked once per adapter set, not per forward pass)."""
        return self._walk(self.model)[1]

    # ---------------------------------------------------------------- shutdown
    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._compute.detach(self)
        with self._step_lock:  # a step in progress ends first
            pass
        self._fail_all(EngineError("the engine was closed"))

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Paused:
    """A pause of the engine's forward passes: ``with`` or ``async with`` (waits off the event loop)."""

    def __init__(self, engine: Engine):
        self._engine = engine

    def __enter__(self):
        self._engine._pause_begin()
        return self._engine

    def __exit__(self, *exc):
        self._engine._pause_end()

    async def __aenter__(self):
        await asyncio.get_running_loop().run_in_executor(None, self._engine._pause_begin)
        return self._engine

    async def __aexit__(self, *exc):
        await asyncio.get_running_loop().run_in_executor(None, self._engine._pause_end)

