"""`groupwise serve` answers only requests that name it (groupwise.core.http_guard): a web page that points its
own name at 127.0.0.1 (DNS rebinding) or a page of another site can neither list the models nor make
one generate; `--allowed-host` lets a name through; the in-process transport the rollouts use passes."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx

from http_forgery import forged_hosts, forged_origins, free_port, probe, probe_allowed, wait_until_up


def _routes(model: str) -> list[tuple[str, str, dict | None]]:
    return [("GET", "/health", None), ("GET", "/v1/models", None), ("GET", f"/v1/models/{model}", None),
            ("GET", "/docs", None), ("GET", "/openapi.json", None),
            ("POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}],
                                              "max_tokens": 1}),
            ("POST", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 1}),
            ("PUT", "/v1/models", None), ("DELETE", "/v1/models", None), ("GET", "/nowhere", None)]


def test_the_serve_command_refuses_forged_hosts_and_origins_and_answers_an_allowed_name(tiny_model_dir):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "groupwise", "serve", "--model", tiny_model_dir, "--device", "cpu",
                             "--port", str(port), "--max-batch-size", "4", "--allowed-host", "my-box.lan"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        wait_until_up(port, proc, timeout_s=300)
        routes = _routes(tiny_model_dir)
        # what a script or the openai SDK sends (no Origin) is answered as before
        import openai

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        r = client.chat.completions.create(model=tiny_model_dir, messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=2)
        assert r.choices[0].message.content is not None
        tally = probe(port, routes)
        tally.check()
        allowed = probe_allowed(port, routes, "my-box.lan")
        allowed.check()
        per_route = 2 * len(forged_hosts(port)) + len(forged_origins(port))
        assert (tally.refused, allowed.refused) == (len(routes) * per_route, len(routes) * 4)
        # a refused generation never reached the engine: the SDK sees a 403 naming the header
        forged = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                               default_headers={"Host": f"evil.example:{port}"})
        try:
            forged.models.list()
        except openai.PermissionDeniedError as exc:
            assert exc.body["param"] == "host" and "--allowed-host evil.example" in exc.body["message"]
        else:
            raise AssertionError("a forged Host was answered")
        print(f"serve: {tally.refused + allowed.refused} forged requests refused, "
              f"{tally.answered + allowed.answered} honest ones answered")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def test_the_in_process_transport_the_rollouts_use_passes_the_check(served, client):
    """httpx's ASGI transport names the URL's host as Host and as the connection's address: no socket,
    no page can send through it, and the check lets it through without a name to allow."""
    models = await client.models.list()
    assert "agent" in [m.id for m in models.data]
    r = await client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert r.model == "agent@2"


async def test_the_shared_app_over_http_refuses_a_forged_host_on_its_port(live):
    async with httpx.AsyncClient(base_url=live.url) as http:
        ok = await http.get("/v1/models")
        assert ok.status_code == 200
        for host in forged_hosts(live.port):
            r = await http.get("/v1/models", headers={"Host": host})
            assert r.status_code == 403 and r.json()["error"]["code"] == "host_not_allowed", host
