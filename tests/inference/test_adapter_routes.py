"""vLLM's runtime LoRA routes (inference/adapter_routes.py) on the in-process app: a step loaded by name
``<model>@<step>`` becomes what ``<model>`` means, an adapter under a plain name is served by it, both unload;
a folder that is no adapter, a name loaded twice, the base model and an unknown name are refused as the
caller's errors; an adapter that requests still use is refused with 409 and stays served; without `routers`
the routes do not exist. Over HTTP across frontends: test_frontends.py."""

from __future__ import annotations

import asyncio

import pytest


@pytest.fixture
async def lora_app(tiny):
    from groupwise.inference.adapter_routes import lora_routes
    from groupwise.inference.client import in_process_client, in_process_http_client
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app
    from groupwise.runtime.loading import tiny_random_model

    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    engine = Engine(model, tok, max_batch_size=4, max_new_tokens_default=8)
    registry = ModelRegistry(engine, base_name="tiny")
    registry.register_model("agent")
    app = create_app(registry, routers=[lora_routes])
    client, http = in_process_client(app), in_process_http_client(app)
    yield client, http, engine
    await client.close()
    await http.aclose()
    engine.close()


async def ids(client) -> list[str]:
    return [m.id async for m in client.models.list()]


async def test_load_and_unload_a_step_and_a_named_adapter(lora_app, adapter_dirs):
    client, http, engine = lora_app
    loaded = await http.post("/load_lora_adapter", json={"lora_name": "agent@2", "lora_path": adapter_dirs[2]})
    assert loaded.status_code == 200 and loaded.text == "Success: LoRA adapter 'agent@2' added successfully."
    named = await http.post("/load_lora_adapter", json={"lora_name": "mine", "lora_path": adapter_dirs[1]})
    assert named.status_code == 200
    assert {"agent@2", "mine"} <= set(await ids(client)) and set(engine.adapters()) == {"agent@2", "mine"}
    answer = await client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2)
    assert answer.model == "agent@2"  # the latest step now
    for name in ("agent@2", "mine"):
        gone = await http.post("/unload_lora_adapter", json={"lora_name": name})
        assert gone.status_code == 200 and gone.text == f"Success: LoRA adapter '{name}' removed successfully."
    assert engine.adapters() == [] and not {"agent@2", "mine"} & set(await ids(client))


async def test_the_routes_refuse_what_the_caller_must_fix(lora_app, adapter_dirs, tmp_path):
    client, http, _ = lora_app
    bad = await http.post("/load_lora_adapter", json={"lora_name": "x", "lora_path": str(tmp_path)})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "adapter_load_failed"
    assert "x" not in await ids(client)
    assert (await http.post("/load_lora_adapter", json={"lora_name": "y", "lora_path": adapter_dirs[1]})).status_code == 200
    twice = await http.post("/load_lora_adapter", json={"lora_name": "y", "lora_path": adapter_dirs[1]})
    assert twice.status_code == 400 and "already loaded" in twice.json()["error"]["message"]
    for name in ("tiny", "agent@0"):
        base_model = await http.post("/unload_lora_adapter", json={"lora_name": name})
        assert base_model.status_code == 400 and "base model" in base_model.json()["error"]["message"]
    unknown = await http.post("/unload_lora_adapter", json={"lora_name": "nobody"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "adapter_not_found"
    missing = await http.post("/load_lora_adapter", json={"lora_name": "z"})
    assert missing.status_code == 400 and missing.json()["error"]["message"] == "lora_path: Field required"


async def test_without_the_routers_there_are_no_adapter_routes(served):
    from groupwise.inference.client import in_process_http_client

    async with in_process_http_client(served[2]) as http:
        answer = await http.post("/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"})
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "unknown_url"


async def test_an_adapter_in_use_is_not_unloaded_and_the_caller_hears_why(lora_app, adapter_dirs):
    import threading

    from groupwise.inference.requests import GenerationRequest

    client, http, engine = lora_app
    assert (await http.post("/load_lora_adapter", json={"lora_name": "busy", "lora_path": adapter_dirs[1]})).status_code == 200
    first = threading.Event()
    running = engine.submit(GenerationRequest([1, 2, 3], max_new_tokens=100_000, ignore_eos=True, adapter="busy",
                                              on_token=lambda *_: first.set()))
    assert first.wait(60)
    refused = await http.post("/unload_lora_adapter", json={"lora_name": "busy"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "adapter_in_use"
    assert "serving queued or running requests" in refused.json()["error"]["message"]
    assert "busy" in await ids(client) and "busy" in engine.adapters()  # still served, by its name
    running.cancel()
    for _ in range(600):  # until the engine has dropped the cancelled request (its next step)
        answer = await http.post("/unload_lora_adapter", json={"lora_name": "busy"})
        if answer.status_code != 409:
            break
        await asyncio.sleep(0.05)
    assert answer.status_code == 200 and "busy" not in engine.adapters() and "busy" not in await ids(client)
