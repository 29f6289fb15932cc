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


def hostile_folder(kind: str, good: str, root) -> str:
    """A copy of the LoRA folder `good` made hostile in one way (test_a_hostile_folder_is_refused...)."""
    import json
    import os
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder = root / kind
    shutil.copytree(good, folder)
    config_path, weights_path = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    config = json.loads(config_path.read_text())
    if kind == "pickle":  # the weights as a torch pickle only: never unpickled from a client's path
        torch.save(load_file(weights_path), folder / "adapter_model.bin")
        weights_path.unlink()
    elif kind == "nan":
        save_file({k: torch.full_like(v, float("nan")) for k, v in load_file(weights_path).items()}, weights_path)
    elif kind == "fifo":
        weights_path.unlink()
        os.mkfifo(weights_path)
    elif kind == "huge_rank":
        config["r"] = 10**6
    elif kind == "regex":  # peft re.fullmatch-es it against every module name: a backtracking one stalls the core
        config["target_modules"] = "(a|aa)+$"
    elif kind == "modules_to_save":
        config["modules_to_save"] = ["embed_tokens"]
    config_path.write_text(json.dumps(config))
    return str(folder)


@pytest.mark.parametrize("kind, says", [
    ("pickle", "never loaded from a client's path"), ("nan", "NaN or infinite"), ("fifo", "not a regular file"),
    ("huge_rank", "r must be an integer from 1 to 1024"), ("regex", "is a regular expression"),
    ("modules_to_save", "modules_to_save is not served"), ("relative", "must be an absolute path"),
    ("file", "is not a folder")])
async def test_a_hostile_folder_is_refused_before_the_engine_reads_it(lora_app, adapter_dirs, tmp_path, kind, says):
    import os
    import threading

    client, http, engine = lora_app
    path = {"relative": "step1", "file": f"{adapter_dirs[1]}/adapter_config.json"}.get(kind) or hostile_folder(
        kind, adapter_dirs[1], tmp_path)
    stop = threading.Event()

    def open_the_fifo_for_writing() -> None:  # releases a reader that blocks on the FIFO (the engine's thread)
        while not stop.is_set():
            try:
                os.close(os.open(path + "/adapter_model.safetensors", os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # no reader yet
                pass
            stop.wait(0.01)

    writer = threading.Thread(target=open_the_fifo_for_writing, daemon=True)
    if kind == "fifo":
        writer.start()
    try:
        refused = await http.post("/load_lora_adapter", json={"lora_name": "evil", "lora_path": path})
    finally:
        stop.set()
    error = refused.json()["error"]
    assert refused.status_code == 400 and error["code"] == "adapter_load_failed" and says in error["message"], error
    assert "evil" not in engine.adapters() and "evil" not in await ids(client)
    good = await http.post("/load_lora_adapter", json={"lora_name": "good", "lora_path": adapter_dirs[1]})
    answer = await client.chat.completions.create(model="good", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2)
    assert good.status_code == 200 and answer.model == "good"


@pytest.mark.parametrize("name", ["a\x00b", "a\nb", " padded", "tab\t", "\u202eright-to-left"])
async def test_a_name_with_control_characters_or_surrounding_space_is_refused(lora_app, adapter_dirs, name):
    _, http, engine = lora_app
    refused = await http.post("/load_lora_adapter", json={"lora_name": name, "lora_path": adapter_dirs[1]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "lora_name"
    assert engine.adapters() == []


async def test_loads_past_the_adapter_limit_are_refused_until_one_is_unloaded(lora_app, adapter_dirs, monkeypatch):
    from groupwise.inference import adapter_routes

    _, http, engine = lora_app
    monkeypatch.setattr(adapter_routes, "MAX_CLIENT_ADAPTERS", 2)
    for name in ("a", "b"):
        assert (await http.post("/load_lora_adapter", json={"lora_name": name, "lora_path": adapter_dirs[1]})).status_code == 200
    full = await http.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": adapter_dirs[1]})
    assert full.status_code == 409 and full.json()["error"]["code"] == "too_many_adapters"
    assert engine.adapters() == ["a", "b"]
    assert (await http.post("/unload_lora_adapter", json={"lora_name": "a"})).status_code == 200
    assert (await http.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": adapter_dirs[1]})).status_code == 200


async def test_an_unload_that_lost_a_race_is_a_404_not_an_adapter_in_use(lora_app, adapter_dirs):
    """Two unloads of one name (two frontends): the one whose engine call finds it gone hears 404, and the
    name is no longer served (the adapter was freed under it, as by the other unload)."""
    client, http, engine = lora_app
    assert (await http.post("/load_lora_adapter", json={"lora_name": "raced", "lora_path": adapter_dirs[1]})).status_code == 200
    engine.remove_adapter("raced")  # the other unload's engine call, done first
    late = await http.post("/unload_lora_adapter", json={"lora_name": "raced"})
    assert late.status_code == 404 and late.json()["error"]["code"] == "adapter_not_found"
    assert "raced" not in await ids(client)
