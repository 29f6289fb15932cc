"""The decode step as CUDA graphs: one graph per (batch bucket, attention-length bucket, adapter).

The engine keeps running sequences in slots 0..k-1 of a slot cache whose buffers never move, so a
decode step for k rows can replay a graph captured for B >= k rows (B a power of two; rows k..B-1
are padding that write to the trash column and attend to column 0 only) over the first Lb columns
(Lb a power of two >= the longest sequence + 1). Inputs are copied into static tensors before
each replay. peft picks the adapter in Python, so it is baked in at capture: graphs serve batches
whose rows all use one adapter (mixed batches run eagerly with ``adapter_names``).

Off CUDA, `capture` returns an `EagerReplay` that runs the same static-tensor step eagerly, so the
bucketing, padding rows and adapter selection are tested on CPU (tests/inference/test_engine.py).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Callable

import torch

from groupwise.inference.attention import engine_attention
from groupwise.inference.kv_cache import SlotCache
from groupwise.inference.sampling import sample_fixed

if TYPE_CHECKING:
    from groupwise.inference.engine import Engine

BASE = "__base__"

__all__ = ["EagerReplay", "adapter_ctx", "capture", "decode_with_graph"]


def decode_with_graph(engine: "Engine", ids: torch.Tensor, pos: torch.Tensor, need: int, adapter: str | None,
                      sampling: tuple[list[float], list[int], list[int]] | None = None):
    """One decode step for k rows by replaying (capturing first if new) the graph of its bucket.

    Without `sampling`: returns the logits [k, V]. With `sampling` = per-row (temperatures, seeds,
    token indices): the graph samples too (sampling.sample_fixed) and this returns (tokens [k],
    logprobs [k]) on the device: the [k, V] sampling ops (~15 kernels) then cost one graph launch.
    """
    k = ids.shape[0]
    B = 1 << (k - 1).bit_length()
    B = min(max(B, 1), engine.max_batch_size)
    Lb = min(max(64, 1 << (need - 1).bit_length()), engine.buffers.capacity - 1)
    key = (B, Lb, adapter or BASE, sampling is not None)
    g = engine._graphs.get(key)
    if g is None:
        g = capture(engine, B, Lb, adapter, sampled=sampling is not None)
        engine._graphs[key] = g
    trash = engine.buffers.trash_col
    g["ids"].zero_()
    g["pos"].zero_()
    g["cols"].fill_(trash)
    g["ids"][:k] = ids.to(engine.device, non_blocking=True)
    g["pos"][:k] = pos.to(engine.device, non_blocking=True)
    g["cols"][:k] = pos.to(engine.device, non_blocking=True)
    ar = g["arange"]
    torch.le(ar[None, None, None, :], g["pos"][:, None, :, None], out=g["mask"])
    g["mask"][k:] = False
    g["mask"][k:, :, :, 0] = True
    if sampling is not None:
        temps, seeds, steps = sampling
        # padding rows sample greedily from their (ignored) logits
        g["temps"].copy_(torch.tensor(temps + [0.0] * (B - k), dtype=torch.float32), non_blocking=True)
        g["seeds"].copy_(torch.tensor(seeds + [0] * (B - k), dtype=torch.long), non_blocking=True)
        g["steps"].copy_(torch.tensor(steps + [0] * (B - k), dtype=torch.long), non_blocking=True)
    g["graph"].replay()
    engine.forward_passes += 1
    if sampling is not None:
        return g["tokens"][:k], g["logprobs"][:k]
    return g["logits"][:k, -1]


def capture(engine: "Engine", B: int, Lb: int, adapter: str | None, sampled: bool = False) -> dict[str, Any]:
    """Static input tensors and the captured graph for one bucket. Its output: g["logits"], or with
    `sampled` g["tokens"] and g["logprobs"] (from the static g["temps"], g["seeds"], g["steps"])."""
    dev = engine.device
    g: dict[str, Any] = {
        "ids": torch.zeros((B, 1), dtype=torch.long, device=dev),
        "pos": torch.zeros((B, 1), dtype=torch.long, device=dev),
        "cols": torch.full((B, 1), engine.buffers.trash_col, dtype=torch.long, device=dev),
        "mask": torch.zeros((B, 1, 1, Lb), dtype=torch.bool, device=dev),
        "arange": torch.arange(Lb, device=dev),
    }
    g["mask"][:, :, :, 0] = True
    if sampled:
        g["temps"] = torch.zeros(B, dtype=torch.float32, device=dev)
        g["seeds"] = torch.zeros(B, dtype=torch.long, device=dev)
        g["steps"] = torch.zeros(B, dtype=torch.long, device=dev)
    # The graph reads every tensor it was captured with by ADDRESS, so each must live as long as the
    # graph: the cache view's row index (rows_NQ) was once freed after capture; its memory went to the
    # next prefill, and a later replay scattered K/V with garbage indices (a device-side assert on
    # the second 256-request run of bench/generation.py on an H200).
    cache = g["cache"] = SlotCache(engine.buffers, 0, B, g["cols"], Lb)

    def run():
        kwargs = {engine._cache_kwarg: cache, "use_cache": True}
        logits = engine.model(input_ids=g["ids"], position_ids=g["pos"], attention_mask=g["mask"], **kwargs).logits
        if not sampled:
            return {"logits": logits}
        tokens, logprobs = sample_fixed(logits[:, -1], g["temps"], g["seeds"], g["steps"])
        return {"tokens": tokens, "logprobs": logprobs}

    if dev.type != "cuda":
        # Stand-in for tests on CPU: same static buffers, buckets and padding rows, run eagerly.
        g["graph"] = EagerReplay(engine, run, adapter, g)
        return g
    with adapter_ctx(engine, adapter), torch.inference_mode(), engine_attention(engine._base_model().config):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: lazy inits and autotuning happen outside the capture
                run()
        torch.cuda.current_stream().wait_stream(stream)
        if engine._graph_pool is None or not engine._graphs:
            # A pool whose graphs were all freed (cache growth, a new adapter) is released by the
            # allocator; capturing into its stale handle trips "use_count > 0" (seen on an H200 after
            # a training step). So a capture with no live graph takes a fresh pool.
            engine._graph_pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (the event loop, a trainer check) may use CUDA meanwhile.
        with torch.cuda.graph(graph, pool=engine._graph_pool, capture_error_mode="thread_local"):
            g.update(run())
    g["graph"] = graph
    return g


@contextlib.contextmanager
def adapter_ctx(engine: "Engine", adapter: str | None):
    """Make `adapter` (None/BASE: no adapter) the one peft's layers apply, then restore.

    peft reads the active adapter in Python, so a captured graph bakes it in. We set the layers'
    flags directly instead of calling `set_adapter` / `disable_adapter`, because those also flip
    `requires_grad` of adapters, and the trainer shares this model (its adapter must stay trainable).
    """
    if not engine._is_peft():
        yield
        return
    layers = engine._tuner_layers()
    saved = [(m._active_adapter, m._disable_adapters) for m in layers]
    for m in layers:
        if adapter in (None, BASE):
            m._disable_adapters = True
        else:
            m._active_adapter = [adapter]
            m._disable_adapters = False
    try:
        yield
    finally:
        for m, (active, disabled) in zip(layers, saved):
            m._active_adapter, m._disable_adapters = active, disabled


class EagerReplay:
    """What `capture` returns off CUDA: `replay()` runs the decode step eagerly on the static tensors."""

    def __init__(self, engine: "Engine", run: Callable[[], torch.Tensor], adapter: str | None, g: dict):
        self._engine, self._run, self._adapter, self._g = engine, run, adapter, g

    def replay(self) -> None:
        with (adapter_ctx(self._engine, self._adapter), torch.inference_mode(),
              engine_attention(self._engine._base_model().config)):
            self._g.update(self._run())
