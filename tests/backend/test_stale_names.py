"""A served name never answers with an older adapter than it means, over the real loopback HTTP server and
the real openai client: ``name`` means the latest step trained, so when that step's adapter could not
be loaded ``name`` is refused (not answered by the step before); ``name@k`` for a step not trained yet, or
no longer served, is refused saying which of the two it is; an older step asked for by name is still
answered, on purpose."""

from __future__ import annotations

import openai
import pytest
from backend_helpers import ask, make_backend, sample_groups

import groupwise as gw
from groupwise.inference.engine import Engine, EngineError


async def test_a_name_never_answers_with_an_older_adapter_than_it_means(tiny_model_dir, tmp_path, request,
                                                                        monkeypatch):
    backend = make_backend("local", tmp_path, request, served_steps=1)
    model = gw.TrainableModel("agent", project="stale", base_model=tiny_model_dir)
    await model.register(backend)
    http = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key, max_retries=0)
    config = gw.TrainConfig(learning_rate=1e-2)
    try:
        await model.train(await sample_groups(model, step=0), config=config)
        assert await ask(http, "agent") == "agent@1"
        with pytest.raises(openai.NotFoundError, match=r"step '5' of 'agent' is not served: it is not trained yet "
                                                       r"\(the latest step is 1\)"):
            await ask(http, model.get_inference_name(5))

        # step 2 trains and is checkpointed, but its adapter cannot be loaded into the engine
        real_add = Engine.add_adapter

        def add_adapter(self, name, *args, **kwargs):
            if name.endswith("@2"):
                raise EngineError("no room for another adapter (injected)")
            return real_add(self, name, *args, **kwargs)

        monkeypatch.setattr(Engine, "add_adapter", add_adapter)
        with pytest.raises(Exception, match="injected"):
            await model.train(await sample_groups(model, step=1), config=config)
        with pytest.raises(openai.NotFoundError, match=r"'agent' means its latest step, 2, whose adapter is not "
                                                       r"served.*Ask for 'agent@1'"):
            await ask(http, "agent")  # before: answered by agent@1, silently a step stale
        assert await ask(http, "agent@1") == "agent@1"  # the older step, asked for on purpose
        monkeypatch.undo()

        await backend.unregister(model)  # the run is loaded again from its last checkpoint, as the error says
        await model.register(backend)
        await http.close()
        http = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key, max_retries=0)
        assert await ask(http, "agent") == "agent@2"
        await model.train(await sample_groups(model, step=2), config=config)
        assert await ask(http, "agent") == "agent@3"
        with pytest.raises(openai.NotFoundError, match=r"step '1' of 'agent' is not served: it is no longer served.*"
                                                       r"model\.pinned"):
            await ask(http, "agent@1")  # served_steps=1 unloaded it
    finally:
        await http.close()
        await backend.close()
