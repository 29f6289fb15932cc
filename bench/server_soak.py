"""Soak: honest callers' latency on a real `groupwise serve` while hostile requests try to stall it.

    python bench/server_soak.py                      # 20 s baseline, 40 s under attack, tiny model
    python bench/server_soak.py --seconds 10 --callers 8 --half-open 1500
    PYTHONPATH=/path/to/other/src python bench/server_soak.py   # another checkout's server, same load

A `groupwise serve` process (a tiny random Llama with SmolLM2's tokenizer, on loopback) is measured
in three phases: a baseline where `--callers` honest clients loop over small requests (a chat
completion of 4 tokens, then ``GET /v1/models``); an attack of twice that length where they go on
while hostile clients send, again and again: 2000 tools (~230 KB), 64,000 tools (8.2 MB), an anyOf of
3000 branches, the pattern ``^(a{1000}){1000}$``, model names ``agent@²`` and ``agent@9...9`` (5000
digits), bodies cut off mid-upload, a stop string longer than 32 tokens, and `--half-open`
connections that send half a request head and wait (reopened when the server closes them); and a
rest after which the server's memory is read again. Printed: honest latency per phase (p50, p99,
max, failures), what each hostile kind got back, and the server's RSS at start, at its peak, after.

The honest request's latency is wall time on this machine: on a CPU that other jobs share it moves
with their load, so compare phases of one run, and runs of two checkouts made back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

import httpx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

USER = [{"role": "user", "content": "Say something."}]


def _tool(i: int) -> dict:
    return {"type": "function", "function": {"name": f"f{i}", "description": "does a thing",
                                             "parameters": {"type": "object", "properties": {
                                                 "q": {"type": "string"}, "n": {"type": "integer"}},
                                                 "required": ["q"]}}}


def _small_tool(i: int) -> dict:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}}}}}


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def hostile_bodies() -> dict[str, bytes]:
    chat = {"model": "agent", "messages": USER, "max_tokens": 4}
    bodies = {
        "2000 tools": {**chat, "tools": [_tool(i) for i in range(2000)]},
        "64000 tools": {**chat, "tools": [_small_tool(i) for i in range(64000)]},  # under the 8 MiB limit
        "anyOf x3000": {**chat, "response_format": _format({"anyOf": [
            {"type": "object", "properties": {f"k{i}": {"type": "string"}}, "required": [f"k{i}"]}
            for i in range(3000)]})},
        "(a{1000}){1000}": {**chat, "response_format": _format({"type": "object", "properties": {
            "a": {"type": "string", "pattern": "^(a{1000}){1000}$"}}, "required": ["a"]})},
        "model agent@²": {**chat, "model": "agent@²"},
        "model agent@9x5000": {**chat, "model": "agent@" + "9" * 5000},
        "long stop string": {**chat, "max_tokens": 64, "stop": ["lessness" * 20], "ignore_eos": True},
    }
    return {k: json.dumps(v).encode() for k, v in bodies.items()}


def start_server(python_path: str | None) -> tuple[subprocess.Popen, str, str]:
    from groupwise.runtime.loading import tiny_random_model

    folder = tempfile.mkdtemp(prefix="soak-model-")
    model, tok = tiny_random_model(seed=0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if python_path:
        env["PYTHONPATH"] = python_path
    proc = subprocess.Popen([sys.executable, "-m", "groupwise.cli", "serve", "--model", folder, "--name", "agent",
                             "--port", str(port), "--max-batch-size", "16", "--max-kv-gb", "0.05"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("groupwise serve did not come up")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return proc, url, folder
        except httpx.HTTPError:
            time.sleep(0.3)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


async def honest_caller(url: str, until: float, out: list, failures: Counter) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as http:
        i = 0
        while time.monotonic() < until:
            body = {"model": "agent", "messages": [{"role": "user", "content": f"Hello {i}"}], "max_tokens": 4}
            for method, path, payload in (("POST", "/v1/chat/completions", body), ("GET", "/v1/models", None)):
                t0 = time.monotonic()
                try:
                    r = await http.request(method, path, json=payload)
                    ok = r.status_code == 200
                except httpx.HTTPError as exc:
                    ok, r = False, exc
                if ok:
                    out.append(time.monotonic() - t0)
                else:
                    failures[getattr(r, "status_code", type(r).__name__)] += 1
            i += 1


async def post_raw(port: int, body: bytes, cut: bool = False) -> str:
    """One request on its own connection; `cut`: send half the body and hang up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n".encode() + b"content-type: application/json\r\n"
                     + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
        writer.write(body[: len(body) // 2] if cut else body)
        await writer.drain()
        if cut:
            await asyncio.sleep(0.05)
            return "hung up"
        line = await asyncio.wait_for(reader.readline(), 300)
        return line.split(b" ")[1].decode() if line else "closed"
    except (OSError, asyncio.TimeoutError) as exc:
        return type(exc).__name__
    finally:
        writer.close()


async def hostile_loop(port: int, name: str, body: bytes, until: float, results: dict, cut: bool = False) -> None:
    while time.monotonic() < until:
        t0 = time.monotonic()
        status = await post_raw(port, body, cut)
        results[name].append((status, time.monotonic() - t0))


def half_open_holder(port: int, count: int, until: float, stats: Counter) -> None:
    """Keep `count` connections that send half a request head, reopening the ones the server closes."""
    socks: list[socket.socket] = []

    def one() -> socket.socket | None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n".encode())
            s.setblocking(False)
            stats["opened"] += 1
            return s
        except OSError:
            stats["refused"] += 1
            return None

    while time.monotonic() < until:
        while len(socks) < count and time.monotonic() < until:
            s = one()
            if s is not None:
                socks.append(s)
        alive = []
        for s in socks:
            try:
                if s.recv(1) == b"":
                    stats["closed by server"] += 1
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                stats["closed by server"] += 1
                s.close()
                continue
            alive.append(s)
        socks = alive
        time.sleep(0.5)
    for s in socks:
        s.close()


def attacker(port: int, seconds: float, half_open: int, out: "multiprocessing.Queue") -> None:
    """The hostile clients, in a process of their own: their work must not slow the honest
    clients' measurements (one event loop, one GIL)."""
    bodies = hostile_bodies()
    results: dict[str, list] = defaultdict(list)
    stats: Counter = Counter()
    until = time.monotonic() + seconds
    holder = threading.Thread(target=half_open_holder, args=(port, half_open, until, stats))
    holder.start()

    async def run() -> None:
        loops = [hostile_loop(port, name, body, until, results) for name, body in bodies.items()]
        loops.append(hostile_loop(port, "cut mid-upload", bodies["2000 tools"], until, results, cut=True))
        await asyncio.gather(*loops)

    asyncio.run(run())
    holder.join()
    out.put((dict(results), dict(stats)))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="baseline length; the attack lasts twice as long")
    ap.add_argument("--callers", type=int, default=4, help="honest clients")
    ap.add_argument("--half-open", type=int, default=1500, help="half-open connections held during the attack")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    proc, url, _ = start_server(os.environ.get("PYTHONPATH"))
    port = int(url.rsplit(":", 1)[1])
    peak = [0.0]
    stop_watch = threading.Event()

    def watch() -> None:
        while not stop_watch.wait(0.2):
            peak[0] = max(peak[0], rss_mb(proc.pid))

    try:
        await honest_caller(url, time.monotonic() + 3, [], Counter())  # warm-up
        start_rss = rss_mb(proc.pid)
        threading.Thread(target=watch, daemon=True).start()
        phases: dict[str, tuple[list, Counter]] = {}
        for phase, length in (("baseline", args.seconds), ("under attack", 2 * args.seconds)):
            until = time.monotonic() + length
            lat, fails = [], Counter()
            tasks = [honest_caller(url, until, lat, fails) for _ in range(args.callers)]
            attack = None
            if phase == "under attack":
                queue: multiprocessing.Queue = multiprocessing.Queue()
                attack = multiprocessing.Process(target=attacker, args=(port, length, args.half_open, queue))
                attack.start()
            await asyncio.gather(*tasks)
            if attack is not None:
                results, holder_stats = await asyncio.to_thread(queue.get, True, 600)
                attack.join()
            phases[phase] = (lat, fails)
        await asyncio.sleep(5)
        end_rss = rss_mb(proc.pid)
    finally:
        stop_watch.set()
        proc.terminate()
        proc.wait(30)

    print(f"\nhonest callers: {args.callers}, each a 4-token chat completion then GET /v1/models, in a loop")
    print(f"{'phase':<14}{'requests':>9}{'p50 s':>8}{'p99 s':>8}{'max s':>8}  failures")
    for phase, (lat, fails) in phases.items():
        print(f"{phase:<14}{len(lat):>9}{percentile(lat, 0.5):>8.2f}{percentile(lat, 0.99):>8.2f}"
              f"{(max(lat) if lat else float('nan')):>8.2f}  {dict(fails) or '-'}")
    print(f"\n{'hostile request':<22}{'sent':>6}{'mean s':>8}  answers")
    for name, got in results.items():
        print(f"{name:<22}{len(got):>6}{sum(t for _, t in got) / len(got):>8.2f}  {dict(Counter(s for s, _ in got))}")
    print(f"half-open connections (target {args.half_open}): {dict(holder_stats)}")
    print(f"\nserver RSS: {start_rss:.0f} MB at start, {peak[0]:.0f} MB at peak, {end_rss:.0f} MB after")


if __name__ == "__main__":
    asyncio.run(main())
