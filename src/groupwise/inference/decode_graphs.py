"""The decode step as CUDA graphs: one graph per (batch bucket, attention-length bucket, adapter).

The engine keeps running sequences in slots 0..k-1 of a slot cache whose buffers never move, so a
decode step for k rows can replay a graph captured for B >= k rows (B a power of two; rows k..B-1
are padding that write to the trash column and attend to column 0 only) over the first Lb columns
(Lb a power of two >= the longest sequence + 1). Inputs are copied into static tensors before
each replay. peft picks the adapter in Python, so it is baked in at capture: a graph serves batches
whose rows all use one adapter, or (adapter ``MIXED``) rows of any slot adapters through the stacked
slots (stacked_lora.py), each row's slot index one more static input; other mixes run eagerly.

Where no row needs a penalty, a grammar or top_logprobs, the graph samples too (`graph_sampling`,
sampling.sample_fixed: temperature, seed, and top_k/top_p/min_p through the same `truncate` as the
eager path) and computes the next step's inputs, so `run_decode_steps` launches step t+1 before
the CPU has read step t's tokens. Both more than double the decode throughput of graphs that only
compute logits (bench/generation.py; figures in docs/benchmarks.md).

Off CUDA, `capture` returns an `EagerReplay` that runs the same static-tensor step eagerly, so the
bucketing, padding rows and adapter selection are tested on CPU (tests/inference/test_engine.py).
"""

from __future__ import annotations

import contextlib
import gc
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from groupwise.inference.advance import advance, stepped
from groupwise.inference.attention import engine_attention
from groupwise.inference.decode_fusion import DecodeFusion
from groupwise.inference.kv_cache import SlotCache
from groupwise.inference.requests import BASE, SeqState
from groupwise.inference.runner import MIXED, ModelRunner
from groupwise.inference.sampling import sample_fixed
from groupwise.inference.step_state import StepState

SLOT_ROW = 6  # the row of g["inputs"] holding each row's slot index (MIXED graphs)

__all__ = ["EagerReplay", "GraphSampling", "capture", "captured", "decode_with_graph", "graph_sampling",
           "release_rng_capture", "run_decode_steps"]


def decode_with_graph(state: StepState, runner: ModelRunner, ids: list[int], pos: list[int], need: int,
                      adapter: str | None, sampling: "GraphSampling | None" = None,
                      slots: list[int] | None = None) -> torch.Tensor:
    """One decode step for k rows (last tokens `ids`, positions `pos`) by replaying (capturing first
    if new) the graph of its bucket.

    Without `sampling`: returns the logits [k, V]. With `sampling` (`graph_sampling`): the graph
    samples too (sampling.sample_fixed) and this returns [2, k] float64 (row 0: the tokens, exact in
    fp64; row 1: their logprobs) on the device, one copy to read back. `slots`: each row's slot index
    for the ``MIXED`` graph. The inputs go up in two copies (an int64 [7, B] block and a float32 [3, B]
    one): per-tensor copies and mask updates would be ~10 launches, a large part of the CPU time of a
    big step.
    """
    k = len(ids)
    filtered = sampling is not None and sampling.top_k is not None
    g = graph_for(state, runner, k, need, adapter, sampled=sampling is not None, filtered=filtered)
    B = g["B"]
    pad = B - k
    # Padding rows: token 0 at position 0, K/V written to the trash column, attending to column 0;
    # greedy (temperature 0), nothing truncated.
    rows = [ids + [0] * pad, pos + [0] * pad, pos + [state.buffers.trash_col] * pad]
    if sampling is not None:
        rows += [sampling.seeds + [0] * pad, sampling.steps + [0] * pad]
        floats = [sampling.temps + [0.0] * pad]
        if filtered:
            rows.append(sampling.top_k + [0] * pad)
            floats += [sampling.top_p + [1.0] * pad, sampling.min_p + [0.0] * pad]
        g["floats"][: len(floats)].copy_(torch.tensor(floats, dtype=torch.float32), non_blocking=True)
    if slots is not None:  # padding rows: no adapter
        rows += [[0] * B for _ in range(SLOT_ROW - len(rows))] + [slots + [-1] * pad]
    g["inputs"][: len(rows)].copy_(torch.tensor(rows, dtype=torch.long), non_blocking=True)
    g["graph"].replay()
    runner.stats.forward_passes += 1
    if sampling is not None:
        return g["out"][:, :k]
    return g["logits"][:k, -1]


def _key(state: StepState, k: int, need: int, adapter: str | None, sampled: bool, filtered: bool) -> tuple:
    B = min(max(1 << (k - 1).bit_length(), 1), state.max_batch_size)
    Lb = min(max(64, 1 << (need - 1).bit_length()), state.buffers.capacity - 1)
    return (B, Lb, adapter or BASE, sampled, filtered)


def graph_for(state: StepState, runner: ModelRunner, k: int, need: int, adapter: str | None, sampled: bool,
              filtered: bool = False) -> dict[str, Any]:
    """The graph of k rows attending to `need` columns (captured on first use). `filtered`: its
    sampling truncates (top_k/top_p/min_p); graphs without it skip the sort over the vocabulary."""
    key = _key(state, k, need, adapter, sampled, filtered)
    g = runner.graphs.get(key)
    if g is None:
        g = runner.graphs[key] = capture(state, runner, key[0], key[1], adapter, sampled=sampled, filtered=filtered)
        state.stats.graph_captures += 1
    return g


def captured(state: StepState, runner: ModelRunner, k: int, need: int, adapter: str | None, sampled: bool,
             filtered: bool = False) -> bool:
    """Whether `graph_for` has this graph already (no capture)."""
    return _key(state, k, need, adapter, sampled, filtered) in runner.graphs


@dataclass
class GraphSampling:
    """Per-row inputs of the graph's sampling; top_k/top_p/min_p are None when no row truncates."""

    temps: list[float]
    seeds: list[int]
    steps: list[int]
    top_k: list[int] | None = None
    top_p: list[float] | None = None
    min_p: list[float] | None = None


def graph_sampling(state: StepState, seqs: list[SeqState]) -> GraphSampling | None:
    """What the decode graph needs to sample every row itself (sampling.sample_fixed), or None
    when a row needs a grammar, a penalty or top_logprobs. An unseeded row draws one random seed
    from the step's CPU generator and hashes (seed, token index) like a seeded row, so the graph can
    step its own inputs (decode_graphs.run_decode_steps)."""
    params = [s.req.sampling for s in seqs]
    if any(s.matcher is not None for s in seqs) or any(p.penalized or p.top_logprobs for p in params):
        return None
    for s in seqs:
        if s.seed is None and s.graph_seed is None:
            s.graph_seed = int(torch.randint(0, 2**62, (1,), generator=state.cpu_generator))
    seeds = [s.seed if s.seed is not None else s.graph_seed for s in seqs]
    out = GraphSampling([p.temperature for p in params], seeds, [len(s.tokens) for s in seqs])
    if any(p.truncates for p in params):
        out.top_k = [max(p.top_k, 0) for p in params]
        out.top_p = [p.top_p for p in params]
        out.min_p = [p.min_p for p in params]
    return out


def run_decode_steps(state: StepState, runner: ModelRunner, seqs: list[SeqState], ids: list[int], pos: list[int],
                     need: int, adapter: str | None, sampling: GraphSampling, slots: list[int] | None = None) -> None:
    """Decode steps for the running rows, each next step launched BEFORE the CPU reads this one's
    tokens (CUDA, graph sampling only).

    The graph computes its own next inputs (g["next"]: the sampled tokens, positions + 1, token
    indices + 1), so step t+1 can start from them on the GPU while the CPU appends step t's tokens,
    checks stops and answers callers (at hundreds of rows that CPU work is a large part of a step,
    with the GPU idle otherwise). A step launched ahead is used only if no row finished (and nothing
    else needs the loop: a request waiting for a free slot, a cancelled request, a pause, a new
    bucket; StepState.wanted_elsewhere); otherwise it is dropped. Dropping is harmless: it wrote each
    row's next K/V column with the very token and position the next step writes again, and finished
    rows' slots are refilled after it in stream order.
    """
    k = len(seqs)
    out = decode_with_graph(state, runner, ids, pos, need, adapter, sampling, slots)  # a view of g["out"]: replays refill it
    g = graph_for(state, runner, k, need, adapter, sampled=True, filtered=sampling.top_k is not None)
    while True:
        g["host"][:, :k].copy_(out, non_blocking=True)
        g["event"].record()
        need += 1
        ahead = need <= g["Lb"] and not state.wanted_elsewhere(k)
        if ahead:
            g["inputs"].copy_(g["next"])
            g["graph"].replay()
            runner.stats.forward_passes += 1
        t0 = time.perf_counter()
        g["event"].synchronize()
        state.stats.decode_wait_s += time.perf_counter() - t0
        tokens, logprobs = g["host"][:, :k].tolist()  # tokens are exact in fp64
        stepped(state, seqs)
        advance(state, seqs, [int(t) for t in tokens], logprobs)
        if not ahead:
            return
        if any(s.finish_reason for s in seqs):
            torch.cuda.current_stream().synchronize()  # the dropped step ends before anything reuses slots
            return


def capture(state: StepState, runner: ModelRunner, B: int, Lb: int, adapter: str | None, sampled: bool = False,
            filtered: bool = False) -> dict[str, Any]:
    """Static input tensors and the captured graph for one bucket. Inputs: g["inputs"] [7, B] int64
    (last token, position, cache column, seed, token index, top_k, slot index of a ``MIXED`` row),
    g["floats"] [3, B] float32 (temperature, top_p, min_p); output: g["logits"], or with `sampled` g["out"] [2, B] (tokens,
    logprobs). With `filtered` the sampling truncates (sampling.truncate)."""
    dev = runner.device
    inputs = torch.zeros((SLOT_ROW + 1, B), dtype=torch.long, device=dev)
    trash = state.buffers.trash_col  # fixed while the graph lives: growing the cache drops all graphs
    inputs[2] = trash
    floats = torch.zeros((3, B), dtype=torch.float32, device=dev)
    floats[1] = 1.0  # top_p 1: nothing truncated
    g: dict[str, Any] = {"B": B, "Lb": Lb, "inputs": inputs, "ids": inputs[0, :, None], "pos": inputs[1, :, None],
                         "cols": inputs[2, :, None], "arange": torch.arange(Lb, device=dev), "floats": floats}
    if sampled and dev.type == "cuda":
        g["host"] = torch.empty((2, B), dtype=torch.float64, pin_memory=True)
        g["event"] = torch.cuda.Event()
    # The graph reads every tensor it was captured with by ADDRESS, so each must live as long as the
    # graph (kept in g): a freed index tensor's memory goes to the next prefill, and a later replay
    # would scatter K/V with garbage indices.
    cache = g["cache"] = SlotCache(state.buffers, 0, B, g["cols"], Lb)

    def run():
        fusion = runner.fusion
        if fusion is None or not fusion.enabled:
            return step(None)
        try:
            return step(fusion)
        except Exception as exc:  # compiling failed (a warm-up's, before any capture): the same step unfused
            fusion.disable(exc)
            return step(None)

    def step(fusion: DecodeFusion | None):
        kwargs = {runner.cache_kwarg: cache, "use_cache": True}
        # row b attends to columns 0..pos[b] (a padding row, at position 0, to column 0 only)
        mask = g["arange"][None, None, None, :] <= g["pos"][:, None, :, None]  # [B, 1, 1, Lb]
        with (runner.mixed_ctx(inputs[SLOT_ROW]) if adapter == MIXED else contextlib.nullcontext(),
              fusion.installed(runner.walk(runner.model)[0]) if fusion is not None else contextlib.nullcontext()):
            logits = runner.model(input_ids=g["ids"], position_ids=g["pos"], attention_mask=mask, **kwargs).logits
        if not sampled:
            return {"logits": logits}
        filters = (inputs[5], floats[1], floats[2]) if filtered else None
        sample = fusion.sample if fusion is not None else sample_fixed
        tokens, logprobs = sample(logits[:, -1], floats[0], inputs[3], inputs[4], filters)
        # the next step's inputs (run_decode_steps): padding rows (cache column = trash) stay as they are
        real, nxt = inputs[2] != trash, inputs[1] + 1
        g["next"] = torch.stack([torch.where(real, tokens, 0), torch.where(real, nxt, 0),
                                 torch.where(real, nxt, trash), inputs[3], inputs[4] + 1, inputs[5], inputs[SLOT_ROW]])
        return {"out": torch.stack([tokens.double(), logprobs.double()])}

    if dev.type != "cuda":
        # Stand-in for tests on CPU: same static buffers, buckets and padding rows, run eagerly.
        g["graph"] = EagerReplay(runner, run, adapter, g)
        return g
    with runner.adapter_ctx(BASE if adapter == MIXED else adapter), torch.inference_mode(), \
            engine_attention(runner.base_model().config):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy inits, autotuning and compiling happen outside the capture
                run()
        torch.cuda.current_stream().wait_stream(stream)
        if runner.graph_pool is None or not runner.graphs:
            # A pool whose graphs were all freed (cache growth, a new adapter) is released by the
            # allocator; capturing into its stale handle trips "use_count > 0" (as after a training
            # step). So a capture with no live graph takes a fresh pool.
            runner.graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: other threads (the event loop, a trainer check) may use CUDA meanwhile.
            with _no_collection(), torch.cuda.graph(graph, pool=runner.graph_pool, capture_error_mode="thread_local"):
                g.update(run())
        except BaseException:
            release_rng_capture(dev)
            raise
    g["graph"] = graph
    return g


@contextlib.contextmanager
def _no_collection():
    """No garbage collection while this thread captures. A collection that ran inside the capture
    freed whatever unreachable cycles held, and a cycle that held a CUDA graph (an engine that was
    closed without releasing its graphs, an earlier backend of the same process) destroyed it there:
    a graph's destruction is one of the calls a capture forbids on its own thread, so the capture
    failed ("operation not permitted when stream is capturing") and the engine decoded eagerly from
    then on (measured: a backend started after another one closed, on an H200)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def release_rng_capture(device: torch.device) -> None:
    """Leave the device's default CUDA generator usable after a failed capture.

    A capture registers the default generator and marks it capturing; torch unmarks it only once the
    capture has ended well. A capture that fails (a step that cannot be captured, a stream invalidated)
    leaves the mark, and from then on every random op of the process on that device (a model's
    initialisation, dropout, `torch.randn`) fails with "Offset increment outside graph capture encountered
    unexpectedly", far from the cause; the engine itself goes on eagerly (decode.py). A copy of the state
    (the same seed and offset) carries no mark, so it replaces the marked one."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    generator.graphsafe_set_state(generator.clone_state())


class EagerReplay:
    """What `capture` returns off CUDA: `replay()` runs the decode step eagerly on the static tensors."""

    def __init__(self, runner: ModelRunner, run: Callable[[], torch.Tensor], adapter: str | None, g: dict):
        self._runner, self._run, self._adapter, self._g = runner, run, adapter, g

    def replay(self) -> None:
        adapter = BASE if self._adapter == MIXED else self._adapter  # run() applies the stacked slots
        with (self._runner.one_adapter(adapter), torch.inference_mode(),
              engine_attention(self._runner.base_model().config)):
            self._g.update(self._run())
