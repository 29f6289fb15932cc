"""The decode side of an engine step: one forward pass for every running sequence, then sampling,
stop checks, retiring finished rows and answering their callers (advance.py).

prefill.py admits and prefills new requests; this module moves the running ones on by one token.
Both are functions of the step state (step_state.py: queues, slot cache, counters) and the model
runner (runner.py). On CUDA the forward pass is a graph replay, and where every row samples plainly
the graph samples too and the next steps run ahead of the CPU (decode_graphs.py).
"""

from __future__ import annotations

import warnings

import torch

from groupwise.inference.advance import advance, retire, sample_isolated, stepped
from groupwise.inference.decode_graphs import captured, decode_with_graph, graph_sampling, run_decode_steps
from groupwise.inference.kv_cache import SlotCache
from groupwise.inference.requests import BASE
from groupwise.inference.runner import MIXED, ModelRunner
from groupwise.inference.step_state import StepState

__all__ = ["decode", "forward_rows"]


def decode(state: StepState, runner: ModelRunner, *, replays_only: bool = False) -> bool:
    """One decode step for every running sequence (on CUDA, possibly several: decode_graphs.py).

    `replays_only`: a trainer is updating on the model's shared modules (Engine.paused(decoding=True)), so
    the step may only replay a decode graph captured before: a graph reads tensors by address and runs no
    module code, while an eager pass or a capture would run the modules whose flags and forwards the
    trainer sets. Returns False, doing nothing, when the step needs more (a capture, an eager pass, more
    KV columns); True when it stepped."""
    seqs = state.running
    k = len(seqs)
    need = max(s.length for s in seqs) + 1
    if replays_only and not (runner.cuda_graphs and state.buffers.fits(need + 1)):
        return False
    if state.buffers.grow(need + 1):
        runner.graphs.clear()
    # a row without tokens yet decodes its prompt's last token (prefill.py: `pending_last_token`)
    last = [s.tokens[-1] if s.tokens else s.req.prompt_ids[-1] for s in seqs]
    positions = [s.length for s in seqs]
    names = runner.peft_names(seqs)
    logits = sampled = None
    one = names is None or len(set(names)) == 1
    if runner.cuda_graphs and (one or runner.mixed_ready(names)):
        try:
            sampling = graph_sampling(state, seqs)
            in_graph, filtered = sampling is not None, sampling is not None and sampling.top_k is not None
            # A mixed batch replays the stacked-adapter graph with each row's slot as an input. So does
            # one slot adapter's batch, unless its own graph is captured already: a run's served steps
            # move between slots, and each slot's own graphs would be captured again for every batch
            # and length bucket its rows meet, each capture costing several passes (counted:
            # EngineStats.graph_captures); one set of stacked graphs serves every slot.
            if one and names and names[0] != BASE and not captured(state, runner, k, need, names[0], in_graph,
                                                                   filtered) and runner.mixed_ready(names):
                one = False
            adapter, slots = (names[0] if names else None, None) if one else (MIXED, runner.mixed_rows(names))
            if replays_only and not captured(state, runner, k, need, adapter, in_graph, filtered):
                return False
            if sampling is not None and runner.device.type == "cuda":
                run_decode_steps(state, runner, list(seqs), last, positions, need, adapter, sampling, slots)
                return True
            out = decode_with_graph(state, runner, last, positions, need, adapter, sampling, slots)
            sampled, logits = (out, None) if sampling is not None else (None, out)
        except Exception as exc:  # fail loud but keep serving: eager decode is correct, only slower
            warnings.warn(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decoding eagerly from now on")
            runner.cuda_graphs = False
            runner.graphs.clear()
    if logits is None and sampled is None:
        if replays_only:
            return False
        rows, logits = forward_rows(state, runner, 0, k, last, positions, need, names)
        keep = [j for j, i in enumerate(rows) if not seqs[i].finish_reason]  # a failed request fails all its rows
        seqs = [seqs[rows[j]] for j in keep]
        logits = logits[keep] if keep else None
    if seqs:
        stepped(state, seqs)
        if sampled is not None:
            tokens, logprobs = sampled.tolist()  # one read-back: tokens (exact in fp64), logprobs
            advance(state, list(seqs), [int(t) for t in tokens], logprobs)
        else:
            sample_isolated(state, list(seqs), logits)
    if any(s.finish_reason for s in state.running):
        retire(state)
    return True


def forward_rows(state: StepState, runner: ModelRunner, a: int, b: int, last: list[int], positions: list[int],
                 need: int, names: list[str] | None) -> tuple[list[int], torch.Tensor | None]:
    """The eager decode pass of running rows [a, b): (rows computed, their logits [rows, V]).

    A failed pass is split in halves and retried until the failing row is alone; that row's request
    fails (StepState.fail_request) and the others go on. A retry is clean: a pass only writes each
    row's K/V column at its own position, which the next pass writes again.
    """
    try:
        # Round up to 8 columns: few distinct shapes, and little extra KV to read (on CPU the
        # decode attention is bound by reading K/V).
        dev = runner.device
        length = min(-(-need // 8) * 8, state.buffers.capacity - 1)
        ids = torch.tensor(last[a:b], dtype=torch.long)[:, None]  # [k, 1]
        pos = torch.tensor(positions[a:b], dtype=torch.long)[:, None]
        mask = torch.arange(length)[None, None, None, :] <= pos[:, None, :, None]  # [k, 1, 1, length]
        cache = SlotCache(state.buffers, a, b - a, pos.to(dev), length)
        part = names[a:b] if names is not None else None
        return list(range(a, b)), runner.forward(ids.to(dev), pos.to(dev), mask.to(dev), cache, part)[:, -1]
    except Exception as exc:
        if b - a == 1:
            state.fail_request(state.running[a].state, exc)
            return [], None
        mid = (a + b) // 2
        rows1, logits1 = forward_rows(state, runner, a, mid, last, positions, need, names)
        rows2, logits2 = forward_rows(state, runner, mid, b, last, positions, need, names)
        parts = [x for x in (logits1, logits2) if x is not None]
        return rows1 + rows2, torch.cat(parts) if parts else None
