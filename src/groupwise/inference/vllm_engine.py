"""An optional vLLM engine behind the `Engine` interface (submit / generate / adapters / paused / close).

Used on a GPU machine where vLLM is installed (``pip install 'groupwise[vllm]'``); the server,
registry and client do not change. vLLM runs its own asyncio loop in a background thread; `submit`
hands a request over with ``run_coroutine_threadsafe`` and returns a `concurrent.futures.Future`
of the same `GenerationResult` the transformers engine returns.

Logprobs: vLLM's default ``logprobs_mode="raw_logprobs"`` is the raw log-softmax the transformers
engine reports (sampling.py), so both engines feed the trainer the same quantity.

Differences, said plainly: vLLM loads its own copy of the weights (no shared base model with the
trainer), so after a training step the adapter is loaded from its checkpoint folder, and
`paused()` puts vLLM to sleep (frees KV cache and, at level 1, offloads weights) so the trainer
gets the GPU memory, like ART's shared mode. Its `stats` (forward passes, prefill tokens, ...) are
not observable and stay 0.
Constraints are passed as a JSON schema or Lark grammar to vLLM's structured outputs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import threading
import uuid
from typing import Any

from groupwise.errors import MissingDependencyError
from groupwise.inference.engine import (BASE, Completion, EngineError, EngineStats, GenerationRequest, GenerationResult,
                                        PromptTooLongError)
from groupwise.inference.requests import DEFAULT_MAX_NEW_TOKENS

__all__ = ["VLLMEngine", "vllm_available"]


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


class VLLMEngine:
    """The vLLM engine with per-request LoRA adapters (``enable_lora``)."""

    def __init__(self, model: str, *, max_batch_size: int = 256, max_new_tokens_default: int = DEFAULT_MAX_NEW_TOKENS,
                 max_loras: int = 4, max_lora_rank: int = 64, max_seq_len: int | None = None,
                 gpu_memory_utilization: float = 0.8, enable_sleep_mode: bool = True, **engine_kwargs: Any):
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine
        except ImportError as exc:
            raise MissingDependencyError("the vLLM engine", "vllm", "vllm") from exc
        self.max_new_tokens_default = max_new_tokens_default
        self.max_batch_size = max_batch_size
        self.stats = EngineStats()
        self._adapters: dict[str, tuple[int, str]] = {}
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="groupwise-vllm", daemon=True)
        self._thread.start()
        args = AsyncEngineArgs(model=model, enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank,
                               max_num_seqs=max_batch_size, max_model_len=max_seq_len,
                               gpu_memory_utilization=gpu_memory_utilization,
                               enable_sleep_mode=enable_sleep_mode, **engine_kwargs)
        self._engine = self._call(self._make(AsyncLLMEngine, args))
        self.tokenizer = self._call(self._engine.get_tokenizer())
        self.context_length = int(self._call(self._engine.get_model_config()).max_model_len)

    @staticmethod
    async def _make(cls, args):
        return cls.from_engine_args(args)

    def _call(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # adapters -------------------------------------------------------------------------------
    def add_adapter(self, name: str, path: str) -> None:
        if name in self._adapters:
            raise EngineError(f"adapter {name!r} is already loaded; remove_adapter({name!r}) first")
        self._adapters[name] = (next(self._ids), str(path))

    def remove_adapter(self, name: str) -> None:
        if name not in self._adapters:
            raise EngineError(f"adapter {name!r} is not loaded; loaded: {sorted(self._adapters)}")
        lora_id, _ = self._adapters.pop(name)
        self._call(self._engine.remove_lora(lora_id))

    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def retarget(self, follow: str, adapter: str) -> int:
        """vLLM keeps a running request on the LoRA it started with: nothing moves mid-sequence (no
        partial rollouts), and each token's provenance is the request's adapter."""
        return 0

    def _lora(self, name: str | None):
        if name in (None, BASE):
            return None
        from vllm.lora.request import LoRARequest

        if name not in self._adapters:
            raise EngineError(f"adapter {name!r} is not loaded; loaded: {self.adapters()}")
        lora_id, path = self._adapters[name]
        return LoRARequest(name, lora_id, path)

    # generation -----------------------------------------------------------------------------
    def _params(self, r: GenerationRequest, max_new: int):
        from vllm import SamplingParams as VSamplingParams

        p = r.sampling
        kwargs: dict[str, Any] = dict(
            n=r.n, temperature=p.temperature, top_p=p.top_p, seed=p.seed, top_k=p.top_k or -1, min_p=p.min_p,
            repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
            frequency_penalty=p.frequency_penalty,
            max_tokens=max_new, stop=r.stop or None, stop_token_ids=r.stop_token_ids or None,
            ignore_eos=r.ignore_eos, logprobs=max(r.sampling.top_logprobs, 0), include_stop_str_in_output=False,
        )
        c = r.constraint
        if c is not None:
            try:
                from vllm.sampling_params import StructuredOutputsParams as SOP

                key = "structured_outputs"
            except ImportError:  # older vLLM
                from vllm.sampling_params import GuidedDecodingParams as SOP

                key = "guided_decoding"
            spec = {"json": c.json_schema} if getattr(c, "json_schema", None) is not None else {"grammar": c.lark}
            kwargs[key] = SOP(**spec)
        return VSamplingParams(**kwargs)

    def submit(self, request: GenerationRequest) -> concurrent.futures.Future:
        problems = request.sampling.problems(request.n)
        if problems:
            raise EngineError("; ".join(problems))
        if len(request.prompt_ids) >= self.context_length:
            raise PromptTooLongError(f"the prompt has {len(request.prompt_ids)} tokens but the context length is "
                                     f"{self.context_length}; shorten the conversation")
        limit = request.max_new_tokens or self.max_new_tokens_default
        max_new = max(1, min(limit, self.context_length - len(request.prompt_ids)))
        lora = self._lora(request.adapter)
        return asyncio.run_coroutine_threadsafe(self._run(request, max_new, lora), self._loop)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await asyncio.wrap_future(self.submit(request))

    async def _run(self, r: GenerationRequest, max_new: int, lora) -> GenerationResult:
        seen = [0] * r.n
        final = None
        async for out in self._engine.generate({"prompt_token_ids": r.prompt_ids}, self._params(r, max_new),
                                               request_id=uuid.uuid4().hex, lora_request=lora):
            final = out
            if r.on_token is not None:
                for c in out.outputs:
                    for j in range(seen[c.index], len(c.token_ids)):
                        tok = c.token_ids[j]
                        lp = c.logprobs[j][tok].logprob if c.logprobs else float("nan")
                        last = j == len(c.token_ids) - 1 and c.finish_reason is not None
                        r.on_token(c.index, tok, lp, c.finish_reason if last else None)
                    seen[c.index] = len(c.token_ids)
        completions = []
        for c in final.outputs:
            lps = [c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)] if c.logprobs else []
            tops = []
            if r.sampling.top_logprobs and c.logprobs:
                tops = [sorted(((tid, lp.logprob) for tid, lp in pos.items()), key=lambda x: -x[1])[: r.sampling.top_logprobs]
                        for pos in c.logprobs]
            completions.append(Completion(c.index, list(c.token_ids), lps, tops, c.text,
                                          "length" if c.finish_reason == "length" else "stop",
                                          adapters=[r.adapter] * len(c.token_ids)))
        return GenerationResult(completions, len(r.prompt_ids), r.adapter)

    # sharing the GPU with the trainer ----------------------------------------------------------
    def paused(self) -> "_Sleep":
        return _Sleep(self)

    def close(self) -> None:
        shutdown = getattr(self._engine, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


class _Sleep:
    """vLLM sleep mode for the length of a training step (``with`` or ``async with``)."""

    def __init__(self, engine: VLLMEngine):
        self._e = engine

    def __enter__(self):
        self._e._call(self._e._engine.sleep(level=1))
        return self._e

    def __exit__(self, *exc):
        self._e._call(self._e._engine.wake_up())

    async def __aenter__(self):
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._e._engine.sleep(level=1), self._e._loop))
        return self._e

    async def __aexit__(self, *exc):
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._e._engine.wake_up(), self._e._loop))
