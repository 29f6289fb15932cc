"""The process's compute thread (groupwise/runtime/compute.py): tasks, direct calls on the thread, engines."""

from __future__ import annotations

import threading

import pytest

from groupwise.runtime.compute import ComputeThread, compute_thread


def test_tasks_run_on_the_thread_in_order_and_errors_reach_the_caller():
    ct = ComputeThread(name="test-compute")
    seen: list[tuple[str, int]] = []
    futures = [ct.submit(lambda i=i: seen.append((threading.current_thread().name, i)) or i * i) for i in range(5)]
    assert [f.result(timeout=10) for f in futures] == [0, 1, 4, 9, 16]
    assert seen == [("test-compute", i) for i in range(5)]
    with pytest.raises(ZeroDivisionError):
        ct.submit(lambda: 1 / 0).result(timeout=10)
    assert ct.submit(lambda: "still serving").result(timeout=10) == "still serving"
    # a task may call() back onto its own thread without waiting for itself
    assert ct.call(lambda: ct.call(lambda: threading.current_thread().name)) == "test-compute"


async def test_run_awaits_off_the_event_loop():
    ct = compute_thread()
    loop_thread = threading.current_thread()
    name = await ct.run(lambda: threading.current_thread())
    assert name is not loop_thread and ct.on_thread() is False


async def test_engine_forward_passes_run_on_the_compute_thread(tiny):
    from groupwise.inference.engine import Engine, GenerationRequest
    from groupwise.runtime.loading import tiny_random_model

    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    threads = set()
    model.register_forward_pre_hook(lambda *a: threads.add(threading.current_thread()))
    eng = Engine(model, tok, max_batch_size=4)
    try:
        p = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
                                    return_dict=True)["input_ids"]
        await eng.generate(GenerationRequest(p, max_new_tokens=4, n=2))
    finally:
        eng.close()
    assert threads == {compute_thread()._thread}
