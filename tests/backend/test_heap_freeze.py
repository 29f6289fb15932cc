"""A process that holds a model keeps what it loaded out of the garbage collector's sight
(`groupwise.runtime.memory.freeze_loaded`): a step's rollouts allocate many short-lived objects, and each
full collection they set off walked every object of torch, transformers and the models (0.3 s pauses of
every thread with a tiny model on the 2-core CPU). A model that is dropped gives its objects back first,
so a cycle among them is still freed. A step freezes again what was made to last since the load when a
slow full collection walked it and enough of it lasted (`refreeze_wanted`), and the user's process freezes
its own load when the model lives in a worker process."""

from __future__ import annotations

import gc
import weakref

import pytest

import groupwise as gw
from groupwise.runtime import memory

pytest.importorskip("torch")
pytest.importorskip("peft")


class _Node:
    pass


async def test_loaded_models_are_frozen_and_what_a_dropped_one_held_is_collected(tmp_path, tiny_model_dir):
    gc.unfreeze()
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", serve_http=False, best_checkpoint_metric=None)
    a = gw.TrainableModel("a", project="p", base_model=tiny_model_dir)
    b = gw.TrainableModel("b", project="p", base_model=tiny_model_dir)
    try:
        await a.register(backend)
        assert gc.get_freeze_count() > 10_000  # torch's and the model's objects

        node = _Node()
        node.me = node  # a cycle alive when the next model is loaded: frozen with it
        ref = weakref.ref(node)
        await b.register(backend)
        del node
        gc.collect()
        assert ref() is not None  # out of the collector's sight while frozen

        await backend.unregister(b)  # thawed, collected, the rest frozen again
        assert ref() is None
        assert gc.get_freeze_count() > 10_000
        client = a.openai_client()  # the frozen model still serves
        r = await client.chat.completions.create(model=a.inference_name(), max_tokens=3,
                                                 messages=[{"role": "user", "content": "hi"}])
        assert r.choices[0].finish_reason in ("length", "stop")
    finally:
        await backend.close()
    assert gc.get_freeze_count() == 0


def test_a_slow_full_collection_asks_to_freeze_again(monkeypatch):
    """What is made to last after the load (torch.compile's graphs, modules imported on first use) is walked by
    every later full collection; one slower than SLOW_FULL_COLLECTION_S asks to freeze again. The threshold is
    set either side of any collection here, so the test does not depend on this machine's speed."""
    gc.unfreeze()
    try:
        memory.freeze_loaded()
        assert not memory.refreeze_wanted()
        monkeypatch.setattr(memory, "SLOW_FULL_COLLECTION_S", 1e9)
        gc.collect()
        assert not memory.refreeze_wanted()  # a fast one: nothing to do
        monkeypatch.setattr(memory, "SLOW_FULL_COLLECTION_S", -1.0)
        monkeypatch.setattr(memory, "REFREEZE_OBJECTS", 20_000)
        gc.collect(1)
        assert not memory.refreeze_wanted()  # a young collection walks what is new only
        gc.collect()
        assert not memory.refreeze_wanted()  # slow, but little has lasted since the freeze: the work in hand
        lasting = [[i] for i in range(30_000)]
        gc.collect()
        assert memory.refreeze_wanted()  # slow, and 30,000 objects lasted since
        memory.freeze_loaded()  # its own full collection is what freezing fixes: not asked again
        assert not memory.refreeze_wanted()
        assert gc.get_freeze_count() >= len(lasting)
        more = [[i] for i in range(30_000)]
        gc.collect()
        gc.unfreeze()
        assert not memory.refreeze_wanted() and more  # nothing frozen: no model is loaded, nothing to freeze again
    finally:
        gc.unfreeze()


async def test_a_step_freezes_again_what_was_made_to_last_since_the_load(tmp_path, tiny_model_dir, monkeypatch):
    gc.unfreeze()
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", serve_http=False, best_checkpoint_metric=None)
    model = gw.TrainableModel("a", project="p", base_model=tiny_model_dir)
    try:
        await model.register(backend)
        kept = [[i] for i in range(memory.REFREEZE_OBJECTS)]  # made to last after the load, as a compiled graph's
        frozen = gc.get_freeze_count()
        monkeypatch.setattr(memory, "SLOW_FULL_COLLECTION_S", -1.0)  # every full collection counts as slow
        gc.collect()
        client = model.openai_client()
        rollouts = []
        for i in range(2):
            r = await client.chat.completions.create(model=model.inference_name(), max_tokens=3, temperature=1.0,
                                                     messages=[{"role": "user", "content": "hi"}], seed=i)
            rollouts.append(gw.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}, r.choices[0]],
                                          reward=float(i)))
        await model.train([gw.TrajectoryGroup(rollouts)], config=gw.TrainConfig(learning_rate=1e-3))
        assert gc.get_freeze_count() >= frozen + len(kept)
        assert not memory.refreeze_wanted()
    finally:
        await backend.close()
    assert gc.get_freeze_count() == 0


async def test_a_driver_beside_a_worker_process_freezes_what_it_loaded(tmp_path, tiny_model_dir):
    """The user's process, its model in a worker process: its own full collections would walk torch,
    transformers, the client and the tokenizer (~300,000 objects) every few steps."""
    gc.unfreeze()
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu", engine_process="separate", best_checkpoint_metric=None)
    model = gw.TrainableModel("a", project="p", base_model=tiny_model_dir)
    try:
        await model.register(backend)
        assert backend.worker_pids  # the model is in another process
        assert gc.get_freeze_count() > 10_000
    finally:
        await backend.close()
    assert gc.get_freeze_count() == 0
