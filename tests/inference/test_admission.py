"""When the engine admits waiting requests while rows decode (StepState.admission_due)."""

from __future__ import annotations

import threading
import time

import torch

from groupwise.inference.requests import GenerationRequest, RequestState
from groupwise.inference.step_state import EngineStats, StepState


def _state(max_batch_size: int = 8) -> StepState:
    return StepState(tokenizer=None, buffers=None, prefix_cache=None, max_batch_size=max_batch_size,
                     max_prefill_tokens=8192, context_length=64, eos_token_ids=set(), device=torch.device("cpu"),
                     cv=threading.Condition(), stats=EngineStats())


def _request(n: int = 1, waited: float = 0.0) -> RequestState:
    import concurrent.futures

    st = RequestState(GenerationRequest([1, 2, 3], n=n), concurrent.futures.Future(), 4)
    st.arrived = time.monotonic() - waited
    return st


def test_requests_wait_up_to_one_prefill_while_rows_decode():
    state = _state()
    assert not state.admission_due()  # nothing waits
    state.waiting.append(_request())
    assert state.admission_due()  # an idle engine admits at once
    state.running = [object()] * 3  # rows decode: 5 free slots
    state.prefill_s = 3600.0  # the last prefill pass took an hour: a new arrival waits for it
    assert not state.admission_due()
    assert not state.wanted_elsewhere(3)  # so a run of decode steps goes on
    state.waiting[0].arrived -= 3601.0  # it has waited longer than that pass
    assert state.admission_due() and state.wanted_elsewhere(3)
    state.waiting[0].arrived += 3601.0
    state.waiting.append(_request(n=4))  # 1 + 4 choices take every free slot: nothing more can join
    assert state.admission_due()
    state.prefill_s = 0.0
    state.waiting.pop()
    assert state.admission_due()  # a pass that cost nothing is not waited for
    state.running = [object()] * 8
    assert not state.wanted_elsewhere(8)  # no free slot: decoding goes on
