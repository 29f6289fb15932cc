"""Retiring finished rows: the rows that go on are compacted into slots 0..n-1 with their K/V intact."""

from __future__ import annotations

import concurrent.futures
import threading

import torch

from groupwise.inference.advance import retire
from groupwise.inference.kv_cache import SlotBuffers
from groupwise.inference.requests import GenerationRequest, RequestState, SeqState
from groupwise.inference.step_state import EngineStats, StepState


class _Tokenizer:
    """What answering a finished request reads of a tokenizer (its text); the K/V moves are under test."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _rows(lengths: list[int]) -> tuple[StepState, list[SeqState]]:
    buffers = SlotBuffers(num_layers=2, slots=len(lengths), kv_heads=2, head_dim=3, capacity=16,
                          dtype=torch.float32, device=torch.device("cpu"))
    state = StepState(tokenizer=_Tokenizer(), buffers=buffers, prefix_cache=None, max_batch_size=len(lengths),
                      max_prefill_tokens=8192, context_length=64, eos_token_ids=set(), device=torch.device("cpu"),
                      cv=threading.Condition(), stats=EngineStats())
    for i, length in enumerate(lengths):
        st = RequestState(GenerationRequest([1, 2, 3], max_new_tokens=32), concurrent.futures.Future(), 32)
        row = SeqState(st.req, st, 0, slot=i, length=length, tokens=[10 + i])
        st.seqs.append(row)
        state.running.append(row)
        for layer, buf in enumerate(buffers.keys + buffers.values):  # each row's columns carry its own values
            buf[i, :, :length] = 1000 * layer + 10 * i + torch.arange(length, dtype=torch.float32)[None, :, None]
    return state, list(state.running)


def _kv(state: StepState, slot: int, length: int) -> list[torch.Tensor]:
    return [buf[slot, :, :length].clone() for buf in state.buffers.keys + state.buffers.values]


def test_rows_that_go_on_fill_the_holes_and_keep_their_kv():
    state, rows = _rows([3, 5, 7, 4, 9, 2, 6, 8])
    before = {id(r): _kv(state, r.slot, r.length) for r in rows}
    for i in (1, 2, 5, 7):  # holes below the survivors' count, and finished rows above it
        rows[i].finish_reason = "stop"
    retire(state)
    assert [r.slot for r in state.running] == [0, 1, 2, 3]
    assert sorted(map(id, state.running)) == sorted(id(rows[i]) for i in (0, 3, 4, 6))
    for r in state.running:
        assert all(torch.equal(a, b) for a, b in zip(_kv(state, r.slot, r.length), before[id(r)]))
    for i in (1, 2, 5, 7):  # each finished request is answered with its tokens
        assert rows[i].state.future.result().completions[0].token_ids == [10 + i]
    for i in (0, 3, 4, 6):
        assert not rows[i].state.future.done()


def test_every_row_finished_or_none_finished():
    state, rows = _rows([4, 6, 3])
    retire(state)  # nothing finished: nothing moves
    assert state.running == rows and [r.slot for r in rows] == [0, 1, 2]
    for r in rows:
        r.finish_reason = "length"
    retire(state)
    assert state.running == [] and all(r.state.future.done() for r in rows)
