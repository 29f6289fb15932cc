"""`groupwise serve --frontends 2` as a user starts it (inference/frontends.py): one engine core process and two
frontend processes on one port, driven over real HTTP by the real `openai` client and httpx, on the tiny random
model. Which frontend answered a request is read from the core's count of requests per frontend pid
(wire.CoreStatus.added), never exposed over HTTP. Concurrent chats are served by both frontends; an adapter
loaded through one frontend is served by the other, and unloaded for both; the Host/Origin guard and the key
hold on each frontend; a frontend killed with SIGKILL has its request freed in the core and is replaced while
the other serves; a killed core fails the requests of every frontend with a 503 naming its exit, and the
command exits 1. The tests share one server and run in file order (the last kills its core)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading

import httpx
import pytest
from polling import wait_for

KEY = "test-key"
MESSAGES = [{"role": "user", "content": "Say something."}]


class Served:
    """`groupwise serve --frontends 2` and a client of its core that reads the core's per-frontend counts."""

    def __init__(self, model_dir: str, adapter: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "groupwise.cli", "serve", "--model", model_dir, "--name", "agent", "--device", "cpu",
             "--port", str(self.port), "--max-batch-size", "32", "--max-kv-gb", "0.02", "--frontends", "2",
             "--lora-routes", "--api-key", KEY, "--adapter", adapter],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()
        serving = self.line("serving through 2 frontend processes")
        self.pids = [int(p) for p in serving.split("(pids ")[1].split(")")[0].split(", ")]
        core = self.line("engine core: pid").split()
        self.core_pid, address = int(core[3]), core[5]
        from groupwise.inference.engine_client import connect_engine_core

        self.watcher = connect_engine_core(address, tokenizer=None)

    def line(self, start: str, after: int = 0) -> str:
        def found():
            if self.proc.poll() is not None:
                pytest.fail("".join(self.lines)[-4000:])
            return next((ln for ln in self.lines[after:] if ln.startswith(start)), None)
        return wait_for(found, f"the server printed {start!r}", limit_s=300)

    def added(self) -> dict[int, int]:
        return dict(self.watcher.status().added)

    def close(self) -> None:
        if not self.watcher.closed:
            self.watcher.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def served(tiny_model_dir, adapter_dirs, tmp_path_factory):
    step = tmp_path_factory.mktemp("served") / "1"  # a folder named by its step: served as agent@1
    step.symlink_to(adapter_dirs[1])
    server = Served(tiny_model_dir, str(step))
    yield server
    server.close()


def fresh_client(served: Served, **kw) -> httpx.AsyncClient:
    """One connection (a new one per client): the kernel hands it to one of the frontends."""
    return httpx.AsyncClient(base_url=served.url, headers={"authorization": f"Bearer {KEY}"}, timeout=120,
                             limits=httpx.Limits(max_connections=1), **kw)


async def chat(http: httpx.AsyncClient, model: str = "agent", **extra) -> httpx.Response:
    return await http.post("/v1/chat/completions", json={"model": model, "messages": MESSAGES, "max_tokens": 4,
                                                         "temperature": 0, **extra})


async def served_by(served: Served, http: httpx.AsyncClient, model: str = "agent") -> tuple[int, httpx.Response]:
    """A chat on `http`'s connection and the pid of the frontend that sent it to the core."""
    before = served.added()
    answer = await chat(http, model)
    after = served.added()
    (pid,) = [p for p in after if after[p] != before.get(p, 0)]
    return pid, answer


async def on_every_frontend(served: Served, model: str = "agent", check=None) -> None:
    """New connections (the kernel hands each to one frontend) until every frontend of `served` has answered
    a chat of `model` with 200, running `await check(http)` on each connection."""
    seen: set[int] = set()
    for _ in range(40):
        async with fresh_client(served) as http:
            pid, answer = await served_by(served, http, model)
            assert answer.status_code == 200
            if check is not None:
                await check(http)
        seen.add(pid)
        if seen == set(served.pids):
            break
    assert seen == set(served.pids)


async def test_concurrent_chats_are_served_by_both_frontends(served):
    import openai

    before = served.added()
    async with openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key=KEY, max_retries=0,
                                  http_client=httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))) as client:
        answers = await asyncio.gather(*(client.chat.completions.create(
            model="agent", messages=MESSAGES, max_tokens=4, temperature=0) for _ in range(24)))
    assert {a.model for a in answers} == {"agent@1"}  # the --adapter folder named 1: the latest step
    assert len({tuple(a.choices[0].model_extra["token_ids"]) for a in answers}) == 1  # greedy: one answer
    assert all(a.usage.completion_tokens == 4 for a in answers)
    after = served.added()
    grew = {pid: after[pid] - before.get(pid, 0) for pid in served.pids}
    assert sum(grew.values()) == 24 and all(n > 0 for n in grew.values()), grew


async def test_an_adapter_loaded_through_one_frontend_is_served_by_the_other(served, adapter_dirs):
    async with fresh_client(served) as http:
        load = await http.post("/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": adapter_dirs[2]})
        assert load.status_code == 200 and load.text == "Success: LoRA adapter 'other' added successfully."
        loader, answer = await served_by(served, http, "other")  # the same connection: the loading frontend
        assert answer.status_code == 200 and answer.json()["model"] == "other"
        again = await http.post("/v1/load_lora_adapter", json={"lora_name": "other", "lora_path": adapter_dirs[2]})
        assert again.status_code == 400 and "already loaded" in again.json()["error"]["message"]
    tokens = answer.json()["choices"][0]["token_ids"]
    for _ in range(40):  # new connections until the other frontend has served it
        async with fresh_client(served) as http:
            pid, answer = await served_by(served, http, "other")
            assert answer.status_code == 200 and answer.json()["choices"][0]["token_ids"] == tokens
            assert "other" in [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
        if pid != loader:
            break
    assert pid != loader
    async with fresh_client(served) as http:
        gone = await http.post("/v1/unload_lora_adapter", json={"lora_name": "other"})
        assert gone.status_code == 200

    async def unloaded(http: httpx.AsyncClient) -> None:
        assert "other" not in [m["id"] for m in (await http.get("/v1/models")).json()["data"]]
        refused = await chat(http, "other")
        assert refused.status_code == 404 and "not served here" in refused.json()["error"]["message"]

    await on_every_frontend(served, check=unloaded)  # and unloaded for every frontend


async def test_the_host_guard_and_the_key_hold_on_every_frontend(served):
    refused_by: set[int] = set()
    for _ in range(40):
        async with fresh_client(served) as http:
            pid, answer = await served_by(served, http)  # the frontend this connection reaches
            assert answer.status_code == 200
            rebound = await http.get("/v1/models", headers={"host": f"evil.example:{served.port}"})
            assert rebound.status_code == 403 and rebound.json()["error"]["code"] == "host_not_allowed"
            page = await http.get("/v1/models", headers={"origin": "http://evil.example"})
            assert page.status_code == 403 and page.json()["error"]["code"] == "origin_not_allowed"
            keyless = await http.get("/v1/models", headers={"authorization": "Bearer wrong"})
            assert keyless.status_code == 401 and keyless.json()["error"]["code"] == "invalid_api_key"
            body = {"lora_name": "x", "lora_path": "/nowhere"}  # the LoRA routes: the same guard and key
            rebound = await http.post("/v1/load_lora_adapter", json=body, headers={"host": f"evil.example:{served.port}"})
            keyless = await http.post("/v1/unload_lora_adapter", json=body, headers={"authorization": "Bearer wrong"})
            assert (rebound.status_code, keyless.status_code) == (403, 401)
        refused_by.add(pid)
        if refused_by == set(served.pids):
            break
    assert refused_by == set(served.pids)  # the second frontend too


async def test_a_fifo_in_a_clients_lora_folder_is_refused_and_every_frontend_still_serves(served, adapter_dirs,
                                                                                        tmp_path):
    """peft would block the core's one compute thread reading a FIFO named adapter_model.safetensors: no
    frontend would answer again (adapter_folder.py refuses it unopened)."""
    import shutil

    folder = tmp_path / "fifo"
    shutil.copytree(adapter_dirs[1], folder)
    (folder / "adapter_model.safetensors").unlink()
    os.mkfifo(folder / "adapter_model.safetensors")
    async with fresh_client(served) as http:
        refused = await http.post("/v1/load_lora_adapter", json={"lora_name": "fifo", "lora_path": str(folder)})
    assert refused.status_code == 400 and "not a regular file" in refused.json()["error"]["message"]
    await on_every_frontend(served)


async def test_a_killed_frontend_is_freed_in_the_core_and_replaced_while_the_other_serves(served):
    status = served.watcher.status()
    before, cancelled = status.added, status.cancelled
    async with fresh_client(served) as http:
        async with http.stream("POST", "/v1/chat/completions", json={
                "model": "agent", "messages": MESSAGES, "max_tokens": 100_000, "stream": True, "ignore_eos": True}) as r:
            lines = r.aiter_lines()
            while '"token_ids"' not in await anext(lines):  # until tokens flow from the frontend that holds it
                pass
            after = served.added()
            (victim,) = [p for p in after if after[p] != before.get(p, 0)]
            assert served.watcher.status().running == 1
            mark = len(served.lines)
            os.kill(victim, signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):  # its connection died with it
                async for _ in lines:
                    pass
    freed = wait_for(lambda: (s := served.watcher.status()).running == 0 and s.requests == 0 and s,
                     "the dead frontend's request freed", limit_s=120)
    assert freed.cancelled == cancelled + 1
    assert f"(pid {victim}) exited, exit code -9 (killed by SIGKILL)" in served.line("frontend ", mark)
    index = served.pids.index(victim)
    replaced = served.line(f"frontend {index}: pid ", mark)
    served.pids[index] = int(replaced.split()[3])
    assert served.pids[index] != victim
    await on_every_frontend(served)  # both serve: the survivor and the new one


async def test_a_killed_core_fails_every_frontend_with_a_503_naming_its_exit_and_the_command_fails(served):
    """Last: it ends the module's server."""
    before = served.added()
    clients = [fresh_client(served) for _ in range(16)]
    try:
        pending = [asyncio.ensure_future(chat(http, max_tokens=100_000, ignore_eos=True)) for http in clients]
        held = await asyncio.to_thread(wait_for, lambda: (s := served.watcher.status()).requests == 16 and s,
                                       "every request in the core", limit_s=120)  # the loop sends them meanwhile
        holders = {pid for pid in served.pids if held.added.get(pid, 0) > before.get(pid, 0)}
        assert holders == set(served.pids)  # both frontends hold some of them
        os.kill(served.core_pid, signal.SIGKILL)
        answers = await asyncio.gather(*pending)
    finally:
        for http in clients:
            await http.aclose()
    for answer in answers:
        assert answer.status_code == 503
        error = answer.json()["error"]
        assert error["code"] == "engine_process_died"
        assert f"engine core process (pid {served.core_pid}) died, exit code -9 (killed by SIGKILL)" in error["message"]
    assert served.proc.wait(timeout=60) == 1
    assert any(ln.startswith("groupwise serve: error: the engine core process") for ln in served.lines)
    from groupwise.inference.engine_core import pid_exit

    for pid in served.pids:  # no frontend left behind
        wait_for(lambda: not pid_exit(pid)[0], f"frontend {pid} exited", limit_s=120)


def test_sigterm_stops_every_frontend_and_the_core_and_exits_0(tiny_model_dir, adapter_dirs, tmp_path):
    from groupwise.inference.engine_core import pid_exit

    step = tmp_path / "1"
    step.symlink_to(adapter_dirs[1])
    server = Served(tiny_model_dir, str(step))
    try:
        server.watcher.close()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0
        assert any(ln.startswith("stopping the frontends and the engine core") for ln in server.lines)
        for pid in [*server.pids, server.core_pid]:  # nothing left holding the port or the device
            wait_for(lambda: not pid_exit(pid)[0], f"process {pid} exited", limit_s=30)
    finally:
        server.close()


def test_a_frontend_that_keeps_dying_exhausts_its_restart_budget():
    from groupwise.inference.frontends import RestartBudget

    now = [0.0]
    budget = RestartBudget(limit=3, window_s=60.0, clock=lambda: now[0])
    assert [budget.spend() for _ in range(4)] == [True, True, True, False]  # the 4th death within a minute stops
    now[0] = 59.0
    assert budget.spend() is False  # all three restarts are still inside the window
    now[0] = 60.5
    assert budget.spend() is True  # the first three left the window: one killed now and then is still replaced
    assert budget.spend() is True and budget.spend() is True and budget.spend() is False
