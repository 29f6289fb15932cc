"""The prefill of newly admitted requests: prefix-cache hits, a warm-up pass for shared prefixes,
the chunked padded forward over the rest, the n > 1 siblings, and each choice's first token.

`admit` picks the waiting requests that fit. Steps for the m requests admitted together (the
engine's running rows stay in slots 0..k-1; these take slots k..k+m-1, their extra choices the
slots after)::

    1. match   each prompt against the prefix cache (prefix_cache.py): h_r tokens found
    2. warm    if requests of this batch share a prefix the cache lacks (the system prompt on a cold
               cache, a GRPO group's common prompt), prefill one copy of each shared prefix first, in
               one pass, and store it; then match again. Only when that saves >= MIN_WARM_GAIN tokens.
    3. copy    each hit into columns [0, h_r) of its slot
    4. forward the suffixes prompt_r[h_r:], left-padded, in chunks of queries (`run_rows`)
    5. store   each prompt's KV in the prefix cache; copy it to the sibling slots (n > 1); sample

A hit stops one token short of the prompt, so every row has at least one query left (its logits give
the first token). Where decode steps replay graphs, a row left with only that one query skips step 4:
it joins the running rows at the length of its hit, its last prompt token pending, and the next
decode step computes that token with them and samples its first token (`pending_last_token`). On a
GPU an eager forward is the host's Python, ~60 ms whatever its rows (docs/benchmarks.md), and a graph
replay a few; every copy of a GRPO group's prompt comes here once the warm pass stored it, so a step
of groups then runs the warm pass alone. Elsewhere (the CPU, whose decode is as eager as a prefill;
the batch-invariant mode, whose first token comes from a pass of its own request) every row runs step 4.
"""

from __future__ import annotations

import time

import torch

from groupwise.inference.advance import sample_and_advance
from groupwise.inference.kv_cache import SlotCache
from groupwise.inference.prefix_cache import Hit, common_prefix
from groupwise.inference.requests import BASE, RequestState, SeqState
from groupwise.inference.runner import ModelRunner
from groupwise.inference.step_state import StepState

__all__ = ["MIN_WARM_GAIN", "admit", "pending_last_token", "plan_warm", "prefill", "prefill_isolated", "run_rows"]

# A warm-up pass costs a forward's fixed overhead (~10 ms on the 2-core CPU); below this many saved
# prompt tokens a shared prefix is cheaper to recompute per row. Set for the CPU, where the saved tokens'
# compute is what costs: on a GPU an eager forward is the host's Python (~60 ms on an H100's host,
# whatever its rows: docs/benchmarks.md), worth more tokens than a small model's short prompts save.
MIN_WARM_GAIN = 32


def admit(state: StepState) -> list[RequestState]:
    """Take waiting requests, in order, while their choices fit the free slots, the padded prompts fit
    `max_prefill_tokens` (the first always goes: a long prompt is chunked) and the engine's priced memory
    fits its room (batch_memory.py); none before they are due (`StepState.admission_due`). A request that
    does not fit beside the running rows waits for them to finish; one that does not fit an idle engine
    never will, and is refused (`RequestMemoryError`, what to change)."""
    out: list[RequestState] = []
    refused: list[tuple[RequestState, BaseException]] = []
    free = state.max_batch_size - len(state.running)
    longest = 0
    memory = state.memory
    with state.cv:
        state.held_for_memory = False
        if not state.admission_due():
            return out
        room = memory.room(state.held_bytes()) if memory is not None else 0
        while state.waiting:
            st = state.waiting[0]
            longest2 = max(longest, len(st.req.prompt_ids))
            if st.req.n > free or (out and longest2 * (len(out) + 1) > state.max_prefill_tokens):
                break
            if memory is not None:
                price = state.price(out + [st])
                if price.total > room:
                    if out or state.running:
                        state.held_for_memory = not out  # it waits for the running rows to finish
                        break
                    state.waiting.popleft()
                    refused.append((st, memory.refusal(price, room, prompt=len(st.req.prompt_ids), max_new=st.max_new)))
                    continue
            state.waiting.popleft()
            out.append(st)
            free -= st.req.n
            longest = longest2
    for st, exc in refused:
        state.stats.failed_requests += 1
        st.settle(error=exc)
    return out


def prefill_isolated(state: StepState, runner: ModelRunner, states: list[RequestState]) -> None:
    """`prefill`, where an error fails only the request it comes from: a failed batch is split in
    halves and retried until the failing request is alone, then that request fails and the others
    run. Nothing a caller sees happened before the error (tokens reach callers in advance(), which
    isolates its own errors), and the rows' slots are scratch until placed, so a retry is clean."""
    k = len(state.running)
    start = time.perf_counter()
    try:
        prefill(state, runner, states)
        state.prefill_s = time.perf_counter() - start  # it ends reading the first tokens back: the pass's time
    except Exception as exc:
        for s in state.running[k:]:  # placed but never sampled: forget them
            s.slot, s.length = -1, 0
        del state.running[k:]
        if len(states) == 1:
            state.fail_request(states[0], exc)
            return
        half = len(states) // 2
        prefill_isolated(state, runner, states[:half])
        prefill_isolated(state, runner, states[half:])


def prefill(state: StepState, runner: ModelRunner, states: list[RequestState]) -> None:
    """Prefill `states` into slots k.. (k = rows running), then sample each choice's first token."""
    k, m = len(state.running), len(states)
    prompts = [st.req.prompt_ids for st in states]
    adapters = [st.req.adapter or BASE for st in states]
    lens = [len(p) for p in prompts]
    if state.buffers.grow(max(lens) + 1):
        runner.graphs.clear()
    cache = state.prefix_cache
    hits = [cache.match(a, p, len(p) - 1) if cache else Hit() for a, p in zip(adapters, prompts)]
    if cache is not None:
        plan = plan_warm(prompts, adapters, [h.length for h in hits])
        if plan:
            # Slots k.. are scratch until step 3 overwrites them.
            warm = [(prompts[r], upto, hits[r]) for r, upto in plan]
            cache.copy_into([(k + i, hit) for i, (_, _, hit) in enumerate(warm)])
            run_rows(state, runner, k, [p[:upto] for p, upto, _ in warm], [h.length for _, _, h in warm],
                     [adapters[r] for r, _ in plan], logits=False)
            cache.insert([(adapters[r], prompts[r][:upto], k + i) for i, (r, upto) in enumerate(plan)])
            state.stats.warm_passes += 1
            hits = [cache.match(a, p, len(p) - 1) for a, p in zip(adapters, prompts)]
    starts = [h.length for h in hits]
    state.stats.prefix_hit_tokens += sum(starts)
    computed = m  # rows 0..computed-1 run the forward; the rest decode their last prompt token (module doc)
    if pending_last_token(state, runner):
        order = sorted(range(m), key=lambda r: starts[r] == lens[r] - 1)  # stable: the computed rows first
        states, prompts, adapters, lens, hits, starts = ([xs[r] for r in order]
                                                         for xs in (states, prompts, adapters, lens, hits, starts))
        computed = sum(s < n - 1 for s, n in zip(starts, lens))
    if cache is not None:
        cache.copy_into([(k + r, hit) for r, hit in enumerate(hits)])
    logits = None
    if computed:
        if runner.batch_invariant:  # never pending: computed == m
            # One request a pass: its padding and chunking, so its numbers, are its own (engine.py).
            logits = torch.cat([run_rows(state, runner, k + r, [p], [s], [a], logits=True)  # type: ignore[misc]
                                for r, (p, s, a) in enumerate(zip(prompts, starts, adapters))])
        else:
            logits = run_rows(state, runner, k, prompts[:computed], starts[:computed], adapters[:computed],
                              logits=True)  # [computed, V]
        state.stats.prefill_passes += 1
        if cache is not None:
            cache.insert([(adapters[r], prompts[r], k + r) for r in range(computed)])
    _place_and_sample(state, states, lens, logits, computed)


def pending_last_token(state: StepState, runner: ModelRunner) -> bool:
    """Do rows whose prefix-cache hit leaves one prompt token skip the prefill forward (module doc)? Only
    where decode steps replay graphs, and not in the batch-invariant mode."""
    return state.prefix_cache is not None and runner.cuda_graphs and not runner.batch_invariant


def plan_warm(prompts: list[list[int]], adapters: list[str], hit_lens: list[int]) -> list[tuple[int, int]]:
    """Which shared prefixes to prefill once before the batch: [(row, how many of its tokens)].

    Row r can reuse at most need_r tokens: the longest prefix it shares with another row of its
    adapter, one short of its prompt; the cache gave it h_r. A picked row c prefills its tokens
    [h_c, need_c) in the warm pass; every row r then gets min(lcp(c, r), need_c). Rows are tried by
    decreasing need and picked while the tokens they save the others exceed what they cost,
    by MIN_WARM_GAIN at least (a shorter common prefix, the system prompt, is usually picked once;
    a pair sharing a few more tokens is not worth a row of its own).
    """
    m = len(prompts)
    order = sorted(range(m), key=lambda r: (adapters[r], prompts[r]))
    rank = {r: i for i, r in enumerate(order)}
    # adj[i] = lcp of sorted rows i and i+1; lcp of sorted rows i < j = min(adj[i..j-1]).
    adj = [common_prefix(prompts[a], prompts[b]) if adapters[a] == adapters[b] else 0 for a, b in zip(order, order[1:])]
    need = [0] * m
    for i, n in enumerate(adj):
        need[order[i]], need[order[i + 1]] = max(need[order[i]], n), max(need[order[i + 1]], n)
    need = [min(n, len(p) - 1) for n, p in zip(need, prompts)]
    have = list(hit_lens)
    picked: list[tuple[int, int]] = []
    for c in sorted(range(m), key=lambda r: -need[r]):
        if need[c] <= have[c]:
            continue
        shared = _lcps_from(rank[c], adj, order)  # row -> lcp with c (the others: 0)
        gains = {r: min(n, need[c]) - have[r] for r, n in shared.items() if min(n, need[c]) > have[r]}
        if sum(gains.values()) >= MIN_WARM_GAIN:  # c's own tokens are both computed and saved: net 0
            picked.append((c, need[c]))
            have[c] = need[c]
            for r, g in gains.items():
                have[r] += g
    return picked


def _lcps_from(i: int, adj: list[int], order: list[int]) -> dict[int, int]:
    """lcp of sorted row i with each other row sharing at least one token: running minima of adj."""
    out: dict[int, int] = {}
    for step in (-1, 1):
        run, j = 1 << 62, i
        while 0 <= j + step < len(order):
            run = min(run, adj[min(j, j + step)])
            if run == 0:
                break
            j += step
            out[order[j]] = run
    return out


def run_rows(state: StepState, runner: ModelRunner, s0: int, tokens: list[list[int]], starts: list[int],
             adapters: list[str], logits: bool) -> torch.Tensor | None:
    """Prefill tokens[r][starts[r]:] into slot s0 + r, whose columns [0, starts[r]) already hold the
    KV of the tokens before. Returns the last position's logits [rows, V] when asked."""
    dev = runner.device
    m = len(tokens)
    sizes = [len(t) - s for t, s in zip(tokens, starts)]
    P = max(sizes)
    trash = state.buffers.trash_col
    pad = state.tokenizer.pad_token_id if state.tokenizer.pad_token_id is not None else 0
    ids = torch.full((m, P), pad, dtype=torch.long)
    pos = torch.zeros((m, P), dtype=torch.long)
    cols = torch.full((m, P), trash, dtype=torch.long)
    real = torch.zeros((m, P), dtype=torch.bool)
    for r, (t, s) in enumerate(zip(tokens, starts)):
        n = sizes[r]
        ids[r, P - n :] = torch.tensor(t[s:])
        pos[r, P - n :] = torch.arange(s, len(t))
        cols[r, P - n :] = pos[r, P - n :]
        real[r, P - n :] = True
    state.stats.prefill_tokens += sum(sizes)
    # Chunks of queries [a, b) of the padded suffixes, so the attention scores (m x heads x chunk x
    # columns; materialised by CPU attention) stay bounded for long prompts.
    chunk = max(32, state.max_prefill_tokens // m)
    # Requests name adapters as served; peft knows them by the slot holding their weights.
    names = [runner.peft_name(a) for a in adapters] if runner.is_peft() else None
    out = None
    for a in range(0, P, chunk):
        b = min(P, a + chunk)
        length = int(pos[:, a:b].max()) + 1  # columns any query of this chunk may see
        # mask[r, 0, q, c]: a real query at position p sees columns 0..p; a pad query sees column 0
        # only (its output is discarded, the column just keeps softmax finite).
        col_idx = torch.arange(length)
        mask = (col_idx[None, None, :] <= pos[:, a:b, None]) & real[:, a:b, None]
        mask[:, :, 0] = True
        cache = SlotCache(state.buffers, s0, m, cols[:, a:b].to(dev), length)
        out = runner.forward(ids[:, a:b].to(dev), pos[:, a:b].to(dev), mask[:, None].to(dev), cache, names,
                              logits_to_keep=1)
    return out[:, -1] if logits else None  # the last chunk holds every row's last token (left padding)


def _place_and_sample(state: StepState, states: list[RequestState], lens: list[int], logits_cV: torch.Tensor | None,
                      computed: int) -> None:
    """Choice 0 of request r runs in slot k + r; the other choices (n > 1) in the slots after the m
    prefill rows, with the prompt's KV copied to them. Then every choice of the first `computed`
    requests samples its first token from its request's row of `logits_cV`; the choices of the others
    hold their prompt but its last token, which their first decode step computes (module doc)."""
    k, m = len(state.running), len(states)
    filled = [n if r < computed else n - 1 for r, n in enumerate(lens)]  # KV columns each request's slot holds
    new_seqs: list[SeqState] = []
    rows: list[int] = []
    for r, st in enumerate(states):
        st.seqs[0].slot = k + r
        new_seqs.append(st.seqs[0])
        rows.append(r)
    next_slot = k + m
    for r, st in enumerate(states):
        siblings = st.seqs[1:]
        if siblings:
            slots = list(range(next_slot, next_slot + len(siblings)))
            state.buffers.copy_slot(k + r, slots, filled[r])
            for s, slot in zip(siblings, slots):
                s.slot = slot
                new_seqs.append(s)
                rows.append(r)
            next_slot += len(siblings)
    for s, r in zip(new_seqs, rows):
        s.length = filled[r]
    state.running.extend(new_seqs)
    if logits_cV is not None:  # None when no request was computed
        sampled = [(s, r) for s, r in zip(new_seqs, rows) if r < computed]
        sample_and_advance(state, [s for s, _ in sampled],
                           logits_cV[torch.tensor([r for _, r in sampled], device=logits_cV.device)])

