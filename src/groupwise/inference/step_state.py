"""What an engine step works on: the request queues, the slot cache, the sampling generators, the
counters.

engine.py owns one `StepState` and one `ModelRunner` (runner.py). Admitting and prefilling
(prefill.py), decoding (decode.py, decode_graphs.py) and the bookkeeping after sampling
(advance.py) are functions of those two objects, so everything a step reads or changes is named
here, as a public field, rather than reached through the engine's private attributes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from groupwise.inference.batch_memory import BatchMemory, BatchPrice
from groupwise.inference.kv_cache import SlotBuffers
from groupwise.inference.prefix_cache import PrefixCache
from groupwise.inference.requests import RequestState, SeqState

__all__ = ["EngineStats", "StepState"]


@dataclass
class EngineStats:
    """What the engine did since it started (`Engine.stats`); tests and bench/ read these."""

    forward_passes: int = 0  # model forwards, graph replays included
    prefill_passes: int = 0
    decode_passes: int = 0
    max_decode_batch: int = 0  # the most sequences one decode pass ran (several runs' requests share passes)
    warm_passes: int = 0  # prefills of prefixes shared inside one admitted batch (prefill.py)
    graph_captures: int = 0  # decode graphs captured (decode_graphs.py): each costs a few eager passes
    prefill_tokens: int = 0  # prompt tokens run through the model (pads excluded)
    prefix_hit_tokens: int = 0  # prompt tokens copied from the prefix cache instead
    cancelled_requests: int = 0  # dropped because their caller cancelled (a client went away)
    failed_requests: int = 0  # failed alone: a step error was traced to them, the others went on
    # Wall seconds the compute thread spent in prefill and in decode (decode work launched ahead on CUDA
    # counts when its tokens are read): what is left of a rollout phase is the engine waiting for requests
    # or paused, so a benchmark can tell an engine-bound phase from one its callers hold up.
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_wait_s: float = 0.0  # of decode_s, waiting for the device's tokens (CUDA graph decode); the rest is host work
    decode_s_in_updates: float = 0.0  # of decode_s, while a trainer updated on the shared model (Engine.paused(decoding=True))


class StepState:
    """The engine's requests and KV cache, and the limits a step obeys.

    `cv` guards `waiting`, `pauses`, `replays_only`, `closed` and `cancel_pending`: other threads submit, cancel
    and pause through them. `admitted` and `running` are touched by the compute thread only, inside
    a step (row i of `running` lives in slot i of `buffers`).
    """

    def __init__(self, *, tokenizer: Any, buffers: SlotBuffers, prefix_cache: PrefixCache | None,
                 max_batch_size: int, max_prefill_tokens: int, context_length: int, eos_token_ids: set[int],
                 device: torch.device, cv: threading.Condition, stats: EngineStats, batch_invariant: bool = False,
                 memory: BatchMemory | None = None) -> None:
        self.tokenizer = tokenizer
        self.buffers = buffers
        self.prefix_cache = prefix_cache
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self.context_length = context_length
        self.eos_token_ids = eos_token_ids
        self.cv = cv
        self.waiting: deque[RequestState] = deque()
        self.admitted: list[RequestState] = []  # taken from `waiting`, being prefilled
        self.running: list[SeqState] = []
        self.pauses = 0  # the engine starts no step while > 0 (Engine.paused)
        # While > 0 a trainer updates on the shared modules (Engine.paused(decoding=True)): steps only replay
        # decode graphs captured before, no prefill; `replays_blocked` once the next step needs more than that.
        self.replays_only = 0
        self.replays_blocked = False
        self.replays_begun = 0  # of those, the ones whose update has begun (one still beginning waits for the step lock)
        self.closed = False
        self.cancel_pending = False  # a caller cancelled since the last sweep (Engine sweeps at each step)
        self.stats = stats
        self.batch_invariant = batch_invariant  # batch_invariance.py: a row's numbers never depend on its batch (advance.py)
        self.generator = torch.Generator(device=device)  # unseeded rows of eager sampling
        self.generator.manual_seed(0)
        self.cpu_generator = torch.Generator().manual_seed(0)  # seeds of unseeded rows in graph sampling
        self.prefill_s = 0.0  # how long the last prefill pass took (admission_due)
        self.memory = memory  # prices admissions (batch_memory.py); None: slots and max_prefill_tokens only
        self.held_for_memory = False  # the first waiting request waits for running rows to free memory

    def price(self, admitting: list[RequestState], *, alone: bool = False) -> BatchPrice:
        """What the engine holds at its fullest with the running rows (none if `alone`: an idle engine,
        whose cache keeps its size) and `admitting` (batch_memory.py)."""
        assert self.memory is not None
        cache = self.prefix_cache
        store = 0 if cache is None else cache.num_blocks * cache.block_size * self.buffers.column_bytes() // self.buffers.slots
        running = [] if alone else list(self.running)  # submit() prices from another thread: a snapshot
        return self.memory.price(self.buffers, store, [len(s.req.prompt_ids) + s.state.max_new for s in running],
                                 [len(r.req.prompt_ids) for r in admitting],
                                 [len(r.req.prompt_ids) + r.max_new for r in admitting])

    def held_bytes(self) -> int:
        """Bytes the engine's caches hold now."""
        return self.buffers.nbytes() + (self.prefix_cache.nbytes() if self.prefix_cache is not None else 0)

    def fail_request(self, st: RequestState, exc: BaseException) -> None:
        """Fail one request whose error was traced to it; its running rows are retired by the caller."""
        self.stats.failed_requests += 1
        st.fail(exc)

    def forget_prefixes(self) -> None:
        """Cached prefix KV is only valid for the weights that made it (prefix_cache.py)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def admission_due(self) -> bool:
        """Should the waiting requests be admitted (prefilled) now? At once when no row is running, or
        when they take every free slot; else once the oldest has waited as long as the last prefill
        pass took.

        Why wait at all: a prefill is a forward pass of its own, whose fixed cost (an eager pass over
        every layer) is the same for one prompt as for a hundred, and while it runs no row decodes.
        Requests come in a trickle (a rollout batch's requests are sent one after another; turns of
        multi-turn rollouts end at different steps), so admitting each arrival at the next step runs
        a pass per arrival. Holding them for one prefill's duration bounds the time spent in prefill
        passes to about half of the wall time under any arrival rate (vLLM's scheduler delay, with a
        factor of 1), and delays a request by at most that one pass."""
        with self.cv:  # other threads append to `waiting`
            if not self.waiting:
                return False
            if not self.running or sum(st.req.n for st in self.waiting) >= self.max_batch_size - len(self.running):
                return True
            return time.monotonic() - self.waiting[0].arrived >= self.prefill_s

    def wanted_elsewhere(self, rows: int) -> bool:
        """Should a run of decode steps over `rows` rows hand control back (decode_graphs.py)? Yes when
        a pause (one that lets replays go on too: its update starts once this step ends), a close or a
        cancellation waits, or waiting requests are due a free slot (not while a trainer updates: they are
        admitted after it). Not for the compute thread's queued tasks (serving, checking, tokenising): handing
        back for those was measured on an H100 and gained nothing (four lockstep runs decoded 0.7-1.3 s slower
        of ~6 s, and four off-policy runs stayed slower than lockstep ones; docs/benchmarks.md)."""
        return bool(self.pauses or self.closed or self.cancel_pending or self.replays_only != self.replays_begun
                    or (self.waiting and not self.replays_only and rows < self.max_batch_size and self.admission_due()))
