"""The product server, `groupwise serve`, with the engine in process vs a core fed by K frontend processes.

Each setting starts `groupwise serve MODEL` as a user does (`--engine-process in_process`, or `--frontends K`:
one engine core process and K frontend processes on the one port) and drives it over HTTP with the real
`openai` client: N concurrent chats, each sampling exactly `--tokens` tokens (EOS ignored, temperature 1),
sent by `--clients` client processes started together, so the client's own Python is never the bound. One
untimed round first (the engine's first batches, CUDA graphs), then `--repeats` timed rounds (the best
kept). The model is saved to a temporary folder first, as a user's model would be on disk: "tiny" (a
random Llama), "smollm2-135m", or "qwen2.5-0.5b" (random-init, bench/generation.py's shape).

    python bench/serve_frontends.py                                    # CPU, tiny random Llama, N = 16
    python bench/serve_frontends.py --device cuda --arch qwen2.5-0.5b --requests 256 --tokens 256 \\
        --settings in_process,1,2,4

Prints one row per setting: requests/s, tokens/s and the ratio against the in-process server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")
sys.path.insert(0, SRC)

TOPICS = ["the sea", "a cat", "databases", "the moon", "bread", "chess", "rain", "trains", "music", "tea"]
READY_TIMEOUT_S = 600


def save_model(arch: str, folder: str) -> None:
    """The bench's model as a folder `groupwise serve` loads (weights in bfloat16, SmolLM2's tokenizer)."""
    import torch

    from groupwise.runtime.loading import load_base_model, tiny_random_model

    if arch == "tiny":
        model, tok = tiny_random_model(seed=0)
    elif arch == "qwen2.5-0.5b":
        sys.path.insert(0, HERE)
        from generation import build_model

        model, tok = build_model(arch, torch.device("cpu"), torch.bfloat16)
    else:
        model, tok = load_base_model(arch, device="cpu")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`groupwise serve` in one setting: "in_process", or a number of frontends."""

    def __init__(self, folder: str, setting: str, args) -> None:
        self.port = free_port()
        placement = ["--engine-process", "in_process"] if setting == "in_process" else ["--frontends", setting]
        self.command = [sys.executable, "-m", "groupwise.cli", "serve", "--model", folder, "--name", "m",
                        "--device", args.device, "--port", str(self.port), "--max-batch-size", str(args.max_batch_size),
                        *placement]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [SRC, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        ready = "serving through" if setting != "in_process" else "Uvicorn running on"
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not any(ready in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"groupwise serve ({setting}) did not start:\n" + "".join(self.lines[-40:]))
            time.sleep(0.2)
        self.url = f"http://127.0.0.1:{self.port}/v1"

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def chats(client, first: int, n: int, tokens: int) -> int:
    async def one(i: int) -> int:
        answer = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"Write about {TOPICS[i % len(TOPICS)]} ({i})."}],
            max_tokens=tokens, temperature=1.0, extra_body={"ignore_eos": True})
        return answer.usage.completion_tokens

    return sum(await asyncio.gather(*(one(first + i) for i in range(n))))


def client(args) -> None:
    """--client URL (internal): one client process. Says "ready", runs its chats on "go" (each line of
    stdin a round: "go TOKENS"), prints each round's start, end and token count; ends on "end"."""
    import httpx
    import openai

    async def main() -> None:
        limits = httpx.Limits(max_connections=args.requests, max_keepalive_connections=args.requests)
        async with openai.AsyncOpenAI(base_url=args.client, api_key="unused", max_retries=0, timeout=3600,
                                      http_client=httpx.AsyncClient(limits=limits, timeout=3600)) as c:
            print("ready", flush=True)
            loop = asyncio.get_running_loop()
            while (line := (await loop.run_in_executor(None, sys.stdin.readline)).split()) and line[0] == "go":
                start = time.time()
                tokens = await chats(c, args.first, args.requests, int(line[1]))
                print(json.dumps({"start": start, "end": time.time(), "tokens": tokens}), flush=True)

    asyncio.run(main())


class Clients:
    """`--clients` client processes sharing N chats, each round started together."""

    def __init__(self, url: str, args) -> None:
        k = max(1, min(args.clients, args.requests))
        share = [args.requests // k + (i < args.requests % k) for i in range(k)]
        self.procs = [subprocess.Popen([sys.executable, __file__, "--client", url, "--requests", str(m),
                                        "--first", str(sum(share[:i]))],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                      for i, m in enumerate(share)]
        for proc in self.procs:
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit("a client process did not start")

    def round(self, tokens: int) -> tuple[float, int]:
        for proc in self.procs:
            proc.stdin.write(f"go {tokens}\n")
            proc.stdin.flush()
        results = []
        for proc in self.procs:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("a client process failed (its error is above)")
            results.append(json.loads(line))
        return max(r["end"] for r in results) - min(r["start"] for r in results), sum(r["tokens"] for r in results)

    def close(self) -> None:
        for proc in self.procs:
            proc.stdin.write("end\n")
            proc.stdin.close()
            proc.wait(timeout=60)


def measure(folder: str, setting: str, args) -> tuple[float, int]:
    server = Server(folder, setting, args)
    # A round that outlasts --round-timeout shows the server's last lines, then ends the server (and so
    # the round, whose clients' requests fail): a stuck setting says where it stuck instead of eating
    # the call's time.
    def overdue() -> None:
        print(f"{setting}: a round took over {args.round_timeout:.0f} s; the server's last lines:\n"
              + "".join(server.lines[-40:]), flush=True)
        server.stop()

    watchdog = threading.Timer(args.round_timeout * (args.repeats + 1), overdue)
    watchdog.daemon = True
    watchdog.start()
    try:
        clients = Clients(server.url, args)
        try:
            clients.round(min(args.tokens, 16))  # warm-up: every batch size of a round, untimed
            return min(clients.round(args.tokens) for _ in range(args.repeats))
        finally:
            clients.close()
    finally:
        watchdog.cancel()
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--arch", default="tiny", help="tiny, smollm2-135m or qwen2.5-0.5b")
    p.add_argument("--requests", type=int, default=16, help="concurrent chats (N)")
    p.add_argument("--tokens", type=int, default=32, help="tokens sampled per chat")
    p.add_argument("--settings", default="in_process,1,2", help="comma-separated: in_process and frontend counts")
    p.add_argument("--max-batch-size", type=int, default=None, help="default: N (every chat decoded at once)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--round-timeout", type=float, default=600, help="seconds a round may take (the watchdog "
                   "allows the warm-up and every repeat this long) before the server's log is shown and it is stopped")
    p.add_argument("--clients", type=int, default=4, help="client processes sending the N chats")
    p.add_argument("--client", default=None, help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        client(args)
        return
    args.max_batch_size = args.max_batch_size or args.requests
    settings = args.settings.split(",")
    results: dict[str, tuple[float, int]] = {}
    with tempfile.TemporaryDirectory(prefix="gw-bench-model-") as folder:
        save_model(args.arch, folder)
        for setting in settings:
            results[setting] = measure(folder, setting, args)
            seconds, tokens = results[setting]
            print(f"{setting}: {tokens} tokens in {seconds:.2f} s", flush=True)
    if args.device.startswith("cuda"):
        import torch

        card = torch.cuda.get_device_name()
    else:
        card = f"CPU, {len(os.sched_getaffinity(0))} cores"
    print(f"\ngroupwise serve, {args.arch} on {card}: {args.requests} concurrent chats over HTTP (openai client, "
          f"{args.clients} client processes), {args.tokens} tokens each, at most {args.max_batch_size} decoded at "
          f"once, best of {args.repeats}\n")
    print("| setting | req/s | tok/s | of in process |")
    print("|---|---|---|---|")
    base = results.get("in_process")
    for setting in settings:
        seconds, tokens = results[setting]
        ratio = f"{(tokens / seconds) / (base[1] / base[0]):.2f}x" if base else "-"
        name = "engine in process" if setting == "in_process" else f"--frontends {setting}"
        print(f"| {name} | {args.requests / seconds:.2f} | {tokens / seconds:.0f} | {ratio} |")


if __name__ == "__main__":
    main()
