"""What the engine takes and gives: a request, its result, and the engine's per-sequence state.

Re-exported by engine.py (``from groupwise.inference.engine import GenerationRequest`` is the public
path); they live here so that engine.py holds the batching loop only. `RequestState` and `SeqState`
are the engine's bookkeeping, shared by its step modules (step_state.py), not part of its API.
"""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from groupwise.errors import GroupwiseError, MemoryBudgetError
from groupwise.inference.sampling import SamplingParams

__all__ = ["BASE", "DEFAULT_MAX_NEW_TOKENS", "Completion", "EngineError", "GenerationRequest", "GenerationResult", "PromptTooLongError",
           "RequestFailedError", "RequestMemoryError", "RequestState", "SeqState", "check_request"]

BASE = "__base__"  # the adapter name of the base model in peft's mixed-batch ``adapter_names``

# The completion length of a request that names none (its `max_new_tokens` is None), on every engine.
DEFAULT_MAX_NEW_TOKENS = 256


class EngineError(GroupwiseError, RuntimeError):
    """The engine cannot run a request (closed, bad adapter, ...)."""


class PromptTooLongError(EngineError, ValueError):
    """The prompt does not fit the model's context."""


class RequestMemoryError(EngineError, MemoryBudgetError):
    """The request needs more of the engine's memory than it may ever use (batch_memory.py): refused, not run."""


class RequestFailedError(EngineError):
    """This request failed inside the engine; the requests batched with it went on."""


@dataclass
class GenerationRequest:
    """One request: a tokenised prompt and how to sample it. `adapter` None means the base model."""

    prompt_ids: list[int]
    max_new_tokens: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    adapter: str | None = None
    # A factory of grammar matchers (constrained.py), one per choice; None = unconstrained.
    constraint: Any = None
    # The model whose LATEST policy this request asked for (a plain ``name``, not ``name@step``), else None:
    # when a newer step of it is served, `Engine.retarget` moves the request to that adapter mid-sequence
    # (partial rollouts: the tokens so far keep the KV of the adapter that sampled them).
    follow: str | None = None
    # Called from the compute thread (groupwise/runtime/compute.py) for each sampled token: (choice_index, token_id, logprob, finish_reason|None).
    on_token: Callable[[int, int, float, str | None], None] | None = None


@dataclass
class Completion:
    """One choice: the sampled ids (EOS included when sampled), their raw logprobs, the text, and the
    indices (into token_ids) of the tokens its grammar forced: the only token it allowed there."""

    index: int
    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    text: str
    finish_reason: str  # "stop" or "length"
    forced_indices: list[int] = field(default_factory=list)
    adapters: list[str | None] = field(default_factory=list)  # [T] the adapter that sampled each token (None: base)


@dataclass
class GenerationResult:
    completions: list[Completion]
    prompt_tokens: int
    adapter: str | None


@dataclass
class SeqState:
    """One choice of a request while it runs: its slot in the KV cache, its tokens so far."""

    req: GenerationRequest
    state: "RequestState"
    index: int
    slot: int = -1
    length: int = 0  # KV columns filled
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    forced: list[int] = field(default_factory=list)  # indices into tokens the grammar forced (one allowed token)
    adapters: list[str | None] = field(default_factory=list)  # the adapter that sampled each token (provenance)
    seed: int | None = None
    graph_seed: int | None = None  # an unseeded row's random seed in graph sampling (drawn once)
    matcher: Any = None
    finish_reason: str | None = None
    text_cut: int | None = None  # stop string found: text is cut here


@dataclass
class RequestState:
    """A request in the engine: its caller's future, its choices (`seqs`), its token budget."""

    req: GenerationRequest
    future: concurrent.futures.Future
    max_new: int
    seqs: list[SeqState] = field(default_factory=list)
    arrived: float = field(default_factory=time.monotonic)  # when it joined the queue (StepState.admission_due)

    def settle(self, result: GenerationResult | None = None, error: BaseException | None = None) -> bool:
        """Answer the caller once; a caller that cancelled (went away) is not answered. True if answered."""
        try:
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
            return True
        except concurrent.futures.InvalidStateError:  # cancelled, or answered already
            return False

    def fail(self, exc: BaseException) -> None:
        """This request (only) failed: its rows finish (retire() frees their slots), its caller hears why."""
        for s in self.seqs:
            s.finish_reason = s.finish_reason or "error"
        self.settle(error=RequestFailedError(f"generation failed for this request: {type(exc).__name__}: {exc}"))


def check_request(r: GenerationRequest, *, vocab_size: int, context_length: int, max_batch_size: int,
                  kv_budget_limits_context: bool, known_adapter: Callable[[str], bool],
                  adapters: Callable[[], list[str]]) -> None:
    """Refuse (`PromptTooLongError`, `EngineError`) what a batch would choke on, before the request can share
    a forward pass with others: out-of-range ids index the embedding, an int64-overflowing seed the sampler.
    The engine checks here, and so does a frontend of an engine core process (engine_client.py), so a
    caller's error is raised at submit on either side of the process boundary."""
    problems = r.sampling.problems(r.n)
    if not r.prompt_ids:
        problems.append("the prompt is empty")
    for what, ids in (("prompt", r.prompt_ids), ("stop_token_ids", r.stop_token_ids)):
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            problems.append(f"{what} has token ids outside [0, {vocab_size}) (the vocabulary): {bad[:5]}")
    if len(r.prompt_ids) >= context_length:
        why = f" (what the KV cache budget holds at {max_batch_size} sequences)" if kv_budget_limits_context else ""
        raise PromptTooLongError(
            f"the prompt has {len(r.prompt_ids)} tokens but the context length is "
            f"{context_length}{why}; shorten the conversation (or drop old turns)"
        )
    if r.max_new_tokens is not None and r.max_new_tokens < 1:
        problems.append(f"max_new_tokens={r.max_new_tokens} must be >= 1")
    if not (1 <= r.n <= max_batch_size):
        problems.append(f"n={r.n} must be in [1, max_batch_size={max_batch_size}]")
    if r.adapter not in (None, BASE) and not known_adapter(r.adapter):
        problems.append(f"adapter {r.adapter!r} is not loaded; loaded: {adapters()}")
    if problems:
        raise EngineError("; ".join(problems))
