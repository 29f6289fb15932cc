"""The backend's own HTTP servers check who is asking like `groupwise serve` (groupwise.core.http_guard): the
loopback server `LocalBackend` gives each model (``model.inference_base_url``) and the server a worker
process runs for the driver's router. A web page that points its name at 127.0.0.1 gets 403, the
rollouts' own clients are answered."""

from __future__ import annotations

from urllib.parse import urlsplit

import groupwise as gw
from groupwise.backend.worker import DeviceWorker, ModelSpec, WorkerOptions
from http_forgery import forged_hosts, forged_origins, probe


def _routes(name: str) -> list[tuple[str, str, dict | None]]:
    return [("GET", "/v1/models", None), ("GET", "/health", None),
            ("POST", "/v1/chat/completions", {"model": name, "messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 1})]


async def test_the_loopback_server_of_local_backend_refuses_forged_hosts(tiny_model_dir, tmp_path):
    import asyncio

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        port = urlsplit(model.inference_base_url).port
        key = {"Authorization": f"Bearer {model.inference_api_key}"}
        tally = await asyncio.to_thread(probe, port, _routes("agent"), headers=key)
        tally.check()
        assert tally.refused == 3 * (2 * len(forged_hosts(port)) + len(forged_origins(port)))
        # the model's own clients still reach it: the one for code that takes a base URL, and the in-process one
        import openai

        over_http = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
        r = await over_http.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=1)
        await over_http.close()
        assert r.model == "agent@0"
        r = await model.openai_client().chat.completions.create(model="agent", max_tokens=1,
                                                                messages=[{"role": "user", "content": "hi"}])
        assert r.model == "agent@0"
    finally:
        await backend.close()


async def test_a_workers_server_for_the_router_refuses_forged_hosts(tiny_model_dir, tmp_path):
    import asyncio

    from groupwise.backend.routing import routed_endpoint

    worker = DeviceWorker(0, 1, "cpu", WorkerOptions(dtype=None, max_batch_size=4, engine_kwargs={}, verify_adapter=True, joint_updates=True,
                                               load_model=None, memory_budget_gb=None, serve_http=True,
                                               api_key="k"))
    try:
        info = await worker.load(ModelSpec("agent", tiny_model_dir, gw.LoraConfig(), str(tmp_path / "checkpoints")))
        port = urlsplit(info["url"]).port
        tally = await asyncio.to_thread(probe, port, _routes("agent"), headers={"Authorization": "Bearer k"})
        tally.check()
        assert tally.refused == 3 * (2 * len(forged_hosts(port)) + len(forged_origins(port)))
        # the driver's router names the worker's address in Host: answered
        endpoint = routed_endpoint([info["url"]], api_key="k")
        r = await endpoint.http_client.post("chat/completions", headers={"Authorization": "Bearer k"}, json={
            "model": "agent", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        assert r.status_code == 200, r.text
        await endpoint.http_client.aclose()
    finally:
        await worker.close()
