"""The decode side of an engine step: one forward pass for every running sequence, then sampling,
stop checks, retiring finished rows and answering their callers.

prefill.py admits and prefills new requests; this module moves the running ones on by one token.
Both are functions of the engine (engine.py holds the state: slots, queues, the model lock).
On CUDA the forward pass is a graph replay, and where every row samples plainly the graph samples
too and the next steps run ahead of the CPU (decode_graphs.py).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch

from groupwise.inference.kv_cache import SlotCache
from groupwise.inference.requests import Completion, GenerationResult, _ReqState, _Seq
from groupwise.inference.sampling import sample_next

if TYPE_CHECKING:
    from groupwise.inference.engine import Engine

__all__ = ["advance", "decode", "forward_rows", "retire", "sample_and_advance", "sample_isolated"]


def decode(engine: "Engine") -> None:
    """One decode step for every running sequence (on CUDA, possibly several: decode_graphs.py)."""
    seqs = engine._running
    k = len(seqs)
    need = max(s.length for s in seqs) + 1
    if engine.buffers.grow(need + 1):
        engine._graphs.clear()
    last = [s.tokens[-1] for s in seqs]
    positions = [s.length for s in seqs]
    names = engine._adapter_names(seqs)
    logits = sampled = None
    if engine.cuda_graphs and (names is None or len(set(names)) == 1):
        try:
            from groupwise.inference.decode_graphs import decode_with_graph, graph_sampling, run_decode_steps

            adapter = names[0] if names else None
            sampling = graph_sampling(engine, seqs)
            if sampling is not None and engine.device.type == "cuda":
                run_decode_steps(engine, list(seqs), last, positions, need, adapter, sampling)
                return
            out = decode_with_graph(engine, last, positions, need, adapter, sampling)
            sampled, logits = (out, None) if sampling is not None else (None, out)
        except Exception as exc:  # fail loud but keep serving: eager decode is correct, only slower
            warnings.warn(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decoding eagerly from now on")
            engine.cuda_graphs = False
            engine._graphs.clear()
    if logits is None and sampled is None:
        rows, logits = forward_rows(engine, 0, k, last, positions, need, names)
        keep = [j for j, i in enumerate(rows) if not seqs[i].finish_reason]  # a failed request fails all its rows
        seqs = [seqs[rows[j]] for j in keep]
        logits = logits[keep] if keep else None
    if seqs:
        stepped(engine, seqs)
        if sampled is not None:
            tokens, logprobs = sampled.tolist()  # one read-back: tokens (exact in fp64), logprobs
            advance(engine, list(seqs), [int(t) for t in tokens], logprobs)
        else:
            sample_isolated(engine, list(seqs), logits)
    if any(s.finish_reason for s in engine._running):
        retire(engine)


def forward_rows(engine: "Engine", a: int, b: int, last: list[int], positions: list[int], need: int,
                 names: list[str] | None) -> tuple[list[int], torch.Tensor | None]:
    """The eager decode pass of running rows [a, b): (rows computed, their logits [rows, V]).

    A failed pass is split in halves and retried until the failing row is alone; that row's request
    fails (engine._fail_request) and the others go on. A retry is clean: a pass only writes each
    row's K/V column at its own position, which the next pass writes again.
    """
    try:
        # Round up to 8 columns: few distinct shapes, and little extra KV to read (on CPU the
        # decode attention is bound by reading K/V: 32 extra columns cost ~20% at 32 x 100 tokens).
        dev = engine.device
        length = min(-(-need // 8) * 8, engine.buffers.capacity - 1)
        ids = torch.tensor(last[a:b], dtype=torch.long)[:, None]  # [k, 1]
        pos = torch.tensor(positions[a:b], dtype=torch.long)[:, None]
        mask = torch.arange(length)[None, None, None, :] <= pos[:, None, :, None]  # [k, 1, 1, length]
        cache = SlotCache(engine.buffers, a, b - a, pos.to(dev), length)
        part = names[a:b] if names is not None else None
        return list(range(a, b)), engine._forward(ids.to(dev), pos.to(dev), mask.to(dev), cache, part)[:, -1]
    except Exception as exc:
        if b - a == 1:
            engine._fail_request(engine._running[a].state, exc)
            return [], None
        mid = (a + b) // 2
        rows1, logits1 = forward_rows(engine, a, mid, last, positions, need, names)
        rows2, logits2 = forward_rows(engine, mid, b, last, positions, need, names)
        parts = [x for x in (logits1, logits2) if x is not None]
        return rows1 + rows2, torch.cat(parts) if parts else None


def sample_isolated(engine: "Engine", seqs: list[_Seq], logits_BV: torch.Tensor) -> None:
    """`sample_and_advance`, where a sampling error fails only the row's request (halves, as in
    `forward_rows`): sampling has no effect a caller sees before advance(), which isolates its own."""
    try:
        sample_and_advance(engine, seqs, logits_BV)
    except Exception as exc:
        if len(seqs) == 1:
            engine._fail_request(seqs[0].state, exc)
            return
        mid = len(seqs) // 2
        sample_isolated(engine, seqs[:mid], logits_BV[:mid])
        live = [j for j in range(mid, len(seqs)) if not seqs[j].finish_reason]
        if live:
            sample_isolated(engine, [seqs[j] for j in live], logits_BV[live])


def stepped(engine: "Engine", seqs: list[_Seq]) -> None:
    """A decode pass ran for `seqs`: each wrote one more K/V column."""
    engine.decode_passes += 1
    for s in seqs:
        s.length += 1


def sample_and_advance(engine: "Engine", seqs: list[_Seq], logits_BV: torch.Tensor) -> None:
    allowed = None
    if any(s.matcher is not None for s in seqs):
        from groupwise.inference.constrained import allowed_mask

        allowed = allowed_mask([s.matcher for s in seqs], logits_BV.shape[-1], logits_BV.device)
    tops_needed = max(s.req.sampling.top_logprobs for s in seqs)
    params = [s.req.sampling for s in seqs]
    history = None
    if any(p.penalized for p in params):  # token histories only where a penalty reads them
        history = ([s.req.prompt_ids if s.req.sampling.penalized else [] for s in seqs],
                   [s.tokens if s.req.sampling.penalized else [] for s in seqs])
    tokens_B, logprobs_B, raw_BV = sample_next(
        logits_BV, params, [s.seed for s in seqs], [len(s.tokens) for s in seqs], allowed,
        engine._default_generator, want_raw_BV=tops_needed > 0, history=history,
    )
    top_vals = top_ids = None
    if tops_needed:
        top_vals, top_ids = torch.topk(raw_BV, tops_needed, dim=-1)
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    advance(engine, seqs, tokens_B.tolist(), logprobs_B.tolist(), top_ids, top_vals)


def advance(engine: "Engine", seqs: list[_Seq], tokens: list[int], logprobs: list[float],
             top_ids: list[list[int]] | None = None, top_vals: list[list[float]] | None = None) -> None:
    """Append each row's sampled token, check whether it finished, retire finished rows. An error in
    one row's bookkeeping (its grammar, stop strings, its caller's callback) fails that request only."""
    for b, s in enumerate(seqs):
        if s.finish_reason:  # its request failed or was cancelled meanwhile
            continue
        try:
            t = tokens[b]
            s.tokens.append(t)
            s.logprobs.append(logprobs[b])
            if s.req.sampling.top_logprobs:
                n_top = s.req.sampling.top_logprobs
                s.tops.append(list(zip(top_ids[b][:n_top], top_vals[b][:n_top])))
            if s.matcher is not None:
                s.matcher.consume_token(t)
            s.finish_reason = finish_reason(engine, s, t)
            if s.req.on_token is not None:
                s.req.on_token(s.index, t, logprobs[b], s.finish_reason)
        except Exception as exc:
            engine._fail_request(s.state, exc)
    if any(s.finish_reason for s in engine._running):
        retire(engine)


def finish_reason(engine: "Engine", s: _Seq, t: int) -> str | None:
    r = s.req
    if (t in engine.eos_token_ids and not r.ignore_eos) or t in r.stop_token_ids:
        return "stop"
    if s.matcher is not None and (s.matcher.is_stopped() or s.matcher.is_error()):
        return "stop"
    if r.stop:
        # Decoding a short tail is enough: a stop string can only end in the newest token.
        tail = engine.tokenizer.decode(s.tokens[-32:], skip_special_tokens=True)
        if any(stop in tail for stop in r.stop):
            text = engine.tokenizer.decode(s.tokens, skip_special_tokens=True)
            cuts = [text.find(stop) for stop in r.stop if stop in text]
            if cuts:
                s.text_cut = min(cuts)
                return "stop"
    if len(s.tokens) >= s.state.max_new or s.length + 1 >= engine.context_length:
        return "length"
    return None


def retire(engine: "Engine") -> None:
    """Free the slots of finished rows (the last row moves into each hole) and answer their callers."""
    running = engine._running
    finished: list[_ReqState] = []
    i = len(running) - 1
    while i >= 0:
        if running[i].finish_reason:
            done = running[i]
            last = running[-1]
            if last is not done:
                engine.buffers.move_slot(last.slot, done.slot, last.length)
                last.slot = done.slot
                running[i] = last
            running.pop()
            finished.append(done.state)
        i -= 1
    # running[j] must live in slot j
    for j, s in enumerate(running):
        assert s.slot == j, (j, s.slot)
    if not running:
        with engine._cv:
            idle = not engine._waiting
        if idle:
            # Idle: forget cached prefixes BEFORE any caller hears back, so a client that waits
            # for its answer and then asks again always finds the cache empty, however the
            # threads are scheduled. Cached KV equals a fresh prefill only to fp32 rounding;
            # a run resumed after a crash (its engine never saw the backend's adapter check or
            # a finished validation) must sample the same bits as the straight run
            # (tests/training/test_local_backend.py pins a bit-identical optimizer).
            engine._forget_prefixes()
    for st in finished:
        maybe_resolve(engine, st)


def maybe_resolve(engine: "Engine", st: _ReqState) -> None:
    if not all(s.finish_reason for s in st.seqs) or st.future.done():
        return
    try:
        completions = []
        for s in st.seqs:
            text = engine.tokenizer.decode(s.tokens, skip_special_tokens=True)
            if s.text_cut is not None:
                text = text[: s.text_cut]
            completions.append(Completion(s.index, s.tokens, s.logprobs, s.tops, text, s.finish_reason))
    except Exception as exc:
        engine._fail_request(st, exc)
        return
    st.settle(GenerationResult(completions, len(st.req.prompt_ids), st.req.adapter))
