"""After a pass: sample each row's token, append it, check stops, retire finished rows and answer
their callers.

Used by prefill (each choice's first token) and by decode (every later one, decode.py and
decode_graphs.py); these functions read and change only the step state (step_state.py).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from groupwise.inference.requests import Completion, GenerationResult, RequestState, SeqState
from groupwise.inference.sampling import sample_next
from groupwise.inference.step_state import StepState

log = logging.getLogger(__name__)

__all__ = ["advance", "finish_reason", "maybe_resolve", "retire", "sample_and_advance", "sample_isolated", "stepped"]


def sample_isolated(state: StepState, seqs: list[SeqState], logits_BV: torch.Tensor) -> None:
    """`sample_and_advance`, where a sampling error fails only the row's request (halves, as in
    decode.forward_rows): sampling has no effect a caller sees before advance(), which isolates its own."""
    try:
        sample_and_advance(state, seqs, logits_BV)
    except Exception as exc:
        if len(seqs) == 1:
            state.fail_request(seqs[0].state, exc)
            return
        mid = len(seqs) // 2
        sample_isolated(state, seqs[:mid], logits_BV[:mid])
        live = [j for j in range(mid, len(seqs)) if not seqs[j].finish_reason]
        if live:
            sample_isolated(state, [seqs[j] for j in live], logits_BV[live])


def stepped(state: StepState, seqs: list[SeqState]) -> None:
    """A decode pass ran for `seqs`: each wrote one more K/V column."""
    state.stats.decode_passes += 1
    state.stats.max_decode_batch = max(state.stats.max_decode_batch, len(seqs))
    for s in seqs:
        s.length += 1


def sample_and_advance(state: StepState, seqs: list[SeqState], logits_BV: torch.Tensor) -> None:
    """Sample each row's next token (under its grammar, if any) and advance. A row whose grammar
    allows exactly one token is forced there (SeqState.forced): no decision of the policy, which the
    trainer can leave out (TrainConfig.train_forced_tokens). Graph sampling never takes rows with a
    grammar (decode_graphs.graph_sampling), so every constrained token is sampled here."""
    allowed = forced_B = None
    if any(s.matcher is not None for s in seqs):
        from groupwise.inference.constrained import allowed_mask

        allowed = allowed_mask([s.matcher for s in seqs], logits_BV.shape[-1], logits_BV.device)
        forced_B = allowed.sum(-1) == 1  # [B]; unconstrained rows are all True, never forced
    tops_needed = max(s.req.sampling.top_logprobs for s in seqs)
    params = [s.req.sampling for s in seqs]
    history = None
    if any(p.penalized for p in params):  # token histories only where a penalty reads them
        history = ([s.req.prompt_ids if s.req.sampling.penalized else [] for s in seqs],
                   [s.tokens if s.req.sampling.penalized else [] for s in seqs])
    # sample_next computes the logprobs of a batch of plain rows by a shortcut (logit - lse from the
    # max prob) and of any other batch by the full log-softmax: equal up to the last bits, so a row's
    # logprob would depend on whether a greedy, top-p or top_logprobs row shared its step (timing).
    # The batch-invariant engine always takes the full log-softmax.
    tokens_B, logprobs_B, raw_BV = sample_next(
        logits_BV, params, [s.seed for s in seqs], [len(s.tokens) for s in seqs], allowed,
        state.generator, want_raw_BV=tops_needed > 0 or state.batch_invariant, history=history,
    )
    top_vals = top_ids = None
    if tops_needed:
        top_vals, top_ids = torch.topk(raw_BV, tops_needed, dim=-1)
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    tokens, forced = tokens_B.tolist(), None
    if forced_B is not None:  # one small read-back of [B] bools, after tokens_B's synced the device
        forced = [f and s.matcher is not None for f, s in zip(forced_B.tolist(), seqs)]
    advance(state, seqs, tokens, logprobs_B.tolist(), top_ids, top_vals, forced)


def advance(state: StepState, seqs: list[SeqState], tokens: list[int], logprobs: list[float],
             top_ids: list[list[int]] | None = None, top_vals: list[list[float]] | None = None,
             forced: list[bool] | None = None) -> None:
    """Append each row's sampled token, check whether it finished, retire finished rows. An error in
    one row's bookkeeping (its grammar, stop strings, its caller's callback) fails that request only."""
    for b, s in enumerate(seqs):
        if s.finish_reason:  # its request failed or was cancelled meanwhile
            continue
        try:
            t = tokens[b]
            s.tokens.append(t)
            s.logprobs.append(logprobs[b])
            s.adapters.append(s.req.adapter)  # read under the step lock: a retarget lands between steps
            if forced is not None and forced[b]:
                s.forced.append(len(s.tokens) - 1)
            if s.req.sampling.top_logprobs:
                n_top = s.req.sampling.top_logprobs
                s.tops.append(list(zip(top_ids[b][:n_top], top_vals[b][:n_top])))
            if s.matcher is not None:
                s.matcher.consume_token(t)
            s.finish_reason = finish_reason(state, s, t)
            if s.req.on_token is not None:
                s.req.on_token(s.index, t, logprobs[b], s.finish_reason)
        except Exception as exc:
            state.fail_request(s.state, exc)
    if any(s.finish_reason for s in state.running):
        retire(state)


def finish_reason(state: StepState, s: SeqState, t: int) -> str | None:
    r = s.req
    if (t in state.eos_token_ids and not r.ignore_eos) or t in r.stop_token_ids:
        return "stop"
    if s.matcher is not None and (s.matcher.is_stopped() or s.matcher.is_error()):
        if s.matcher.is_error():  # past llguidance's fuel (docs/security.md): the answer is cut short
            log.warning("a constrained choice ended before its grammar was complete (finish_reason 'stop'): %s",
                        str(s.matcher.get_error())[:300])
        return "stop"
    if r.stop:
        tail = _stop_window(state.tokenizer, s.tokens, max(len(stop) for stop in r.stop))
        if any(stop in tail for stop in r.stop):
            text = state.tokenizer.decode(s.tokens, skip_special_tokens=True)
            cuts = [text.find(stop) for stop in r.stop if stop in text]
            if cuts:
                s.text_cut = min(cuts)
                return "stop"
    if len(s.tokens) >= s.state.max_new or s.length + 1 >= state.context_length:
        return "length"
    return None


def _stop_window(tokenizer: Any, tokens: list[int], longest: int) -> str:
    """The text of the newest tokens, enough of it to hold any stop string that ends in the newest
    token: at least `longest` characters before that token's own, plus a few that a tail's first
    token may decode wrongly (half of a multi-byte character). Decoding a short tail, not the whole
    answer, keeps a step's cost flat; 32 tokens usually suffice, and the tail doubles until its text
    is long enough (a long stop string, tokens that decode to nothing) or it is the whole answer."""
    newest = len(tokenizer.decode(tokens[-1:], skip_special_tokens=True))
    k = 32
    while True:
        tail = tokenizer.decode(tokens[-k:], skip_special_tokens=True)
        if k >= len(tokens) or len(tail) - newest >= longest + _STOP_SLACK_CHARS:
            return tail
        k *= 2


_STOP_SLACK_CHARS = 8


def retire(state: StepState) -> None:
    """Free the slots of finished rows and answer their callers. The rows that go on keep slots
    0..n-1: those already there stay, and those above n move into the holes, all in one copy per KV
    buffer (`SlotBuffers.move_slots`)."""
    running = state.running
    finished = [s.state for s in reversed(running) if s.finish_reason]
    n = len(running) - len(finished)
    holes = [j for j in range(n) if running[j].finish_reason]
    movers = [s for s in running[n:] if not s.finish_reason]  # as many as there are holes
    if movers:
        state.buffers.move_slots([s.slot for s in movers], holes, max(s.length for s in movers))
        for s, j in zip(movers, holes):
            s.slot = j
            running[j] = s
    del running[n:]
    # running[j] must live in slot j
    for j, s in enumerate(running):
        assert s.slot == j, (j, s.slot)
    if not running:
        with state.cv:
            idle = not state.waiting
        if idle:
            # Idle: forget cached prefixes BEFORE any caller hears back, so a client that waits
            # for its answer and then asks again always finds the cache empty, however the
            # threads are scheduled. Cached KV equals a fresh prefill only to fp32 rounding;
            # a run resumed after a crash (its engine never saw the backend's adapter check or
            # a finished validation) must sample the same bits as the straight run
            # (tests/training/test_local_backend.py pins a bit-identical optimizer).
            state.forget_prefixes()
    for st in finished:
        maybe_resolve(state, st)


def maybe_resolve(state: StepState, st: RequestState) -> None:
    if not all(s.finish_reason for s in st.seqs) or st.future.done():
        return
    try:
        completions = []
        for s in st.seqs:
            text = state.tokenizer.decode(s.tokens, skip_special_tokens=True)
            if s.text_cut is not None:
                text = text[: s.text_cut]
            completions.append(Completion(s.index, s.tokens, s.logprobs, s.tops, text, s.finish_reason, s.forced,
                                          s.adapters))
    except Exception as exc:
        state.fail_request(st, exc)
        return
    st.settle(GenerationResult(completions, len(st.req.prompt_ids), st.req.adapter))
