"""A process that holds a model keeps what it loaded out of the garbage collector's sight
(`groupwise.runtime.memory.freeze_loaded`): a step's rollouts allocate many short-lived objects, and each
full collection they set off walked every object of torch, transformers and the models (0.3 s pauses of
every thread with a tiny model on the 2-core CPU). A model that is dropped gives its objects back first,
so a cycle among them is still freed."""

from __future__ import annotations

import gc
import weakref

import pytest

import groupwise as gw

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
