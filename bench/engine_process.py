"""The engine in process vs in a core process of its own (inference/engine_core.py), at N concurrent requests.

What a rollout does, both ways: N concurrent chat requests through the real OpenAI client and the server's
app in this process (chat template, tokenising, response building: the frontend's per-request Python),
answered by the engine in this process, or by an engine core process fed over ZeroMQ. Every request
samples exactly `--tokens` tokens (EOS ignored, temperature 1), so tokens/s compare the same work.
Also the bare engine (`submit` of token ids, no HTTP layer): the hop's own cost. Each size runs
`--repeats` timed pairs, in process then separate, alternated so a load change hits both sides.

    python bench/engine_process.py                                  # CPU, tiny random Llama, N = 8, 32
    python bench/engine_process.py --arch smollm2-135m --threads 2  # CPU, the main job's model
    python bench/engine_process.py --device cuda --arch qwen2.5-0.5b --requests 64,256 --tokens 256

Prints one table row per (N, path): requests/s and tokens/s in process and separate, and their ratio
(separate / in process: above 1 the separate core wins).

With `--frontends 1,2,4` it also runs each N through K frontend processes feeding the one core (each
its own app, client and tokenizer: N/K of the requests, started together), which is what the core's
design is for: one process's per-request Python (one GIL) bounds the app's rate, K processes share it.

    python bench/engine_process.py --device cuda --arch qwen2.5-0.5b --requests 256 --tokens 256 --frontends 1,2,4

The product server built on it (`groupwise serve --frontends K`, over HTTP): bench/serve_frontends.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "src"))

TOPICS = ["the sea", "a cat", "databases", "the moon", "bread", "chess", "rain", "trains", "music", "tea"]


def load(model: str, device=None, dtype=None):
    """`load_model` of both engines (the core process imports it by name): "tiny" (a tiny random Llama),
    "smollm2-135m", or "qwen2.5-0.5b" (random-init, bench/generation.py's shape)."""
    import torch

    from groupwise.runtime.loading import load_base_model, resolve_device, resolve_dtype, tiny_random_model

    if model == "tiny":
        m, tok = tiny_random_model(seed=0)
        return m.to(resolve_device(device)), tok
    if model == "qwen2.5-0.5b":
        from generation import build_model

        dev = resolve_device(device)
        return build_model(model, dev, resolve_dtype(dtype, dev))
    return load_base_model(model, device=device, dtype=dtype)


def engine_of(mode: str, args):
    if mode == "separate":
        from groupwise.inference.engine_client import start_engine_core

        tok = load(args.arch, "cpu")[1] if args.arch != "smollm2-135m" else None
        return start_engine_core(args.arch, tokenizer=tok, device=args.device, load_model="engine_process:load",
                                 engine_kwargs={"max_batch_size": args.max_batch_size})
    from groupwise.inference.engine import Engine
    from groupwise.runtime.compute import compute_thread

    model, tok = compute_thread().call(load, args.arch, device=args.device)
    return Engine(model, tok, max_batch_size=args.max_batch_size)


async def chat_round(client, n: int, tokens: int) -> tuple[float, int]:
    async def one(i: int) -> int:
        answer = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"Write about {TOPICS[i % len(TOPICS)]} ({i})."}],
            max_tokens=tokens, temperature=1.0, extra_body={"ignore_eos": True})
        return answer.usage.completion_tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - start, sum(counts)


def engine_round(engine, prompts: list[list[int]], tokens: int) -> tuple[float, int]:
    from groupwise.inference.requests import GenerationRequest

    start = time.perf_counter()
    futures = [engine.submit(GenerationRequest(p, max_new_tokens=tokens, ignore_eos=True)) for p in prompts]
    results = [f.result() for f in futures]
    return time.perf_counter() - start, sum(len(r.completions[0].token_ids) for r in results)


def measure(mode: str, args, sizes: list[int]) -> dict[tuple[int, str], list[tuple[float, int]]]:
    from groupwise.inference.client import in_process_client
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app

    engine = engine_of(mode, args)
    out: dict[tuple[int, str], list[tuple[float, int]]] = {}
    try:
        registry = ModelRegistry(engine, base_name="m")
        app = create_app(registry)
        tok = engine.tokenizer
        for n in sizes:
            prompts = [tok.apply_chat_template([{"role": "user", "content": f"Write about {TOPICS[i % len(TOPICS)]} ({i})."}],
                                               add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
                       for i in range(n)]
            engine_round(engine, prompts[:2], 4)  # warm-up: first allocations, oneDNN primitives

            async def chats() -> tuple[float, int]:
                async with in_process_client(app) as client:
                    return await chat_round(client, n, args.tokens)

            out[(n, "chat via the app")] = [asyncio.run(chats())]
            out[(n, "engine.submit")] = [engine_round(engine, prompts, args.tokens)]
    finally:
        engine.close()
    return out


def frontend(args) -> None:
    """--frontend ADDRESS (internal): one frontend process of a running core. Says "ready" once its app
    is built, runs its `--requests` chats when stdin says go, prints its start, end and token count."""
    import json

    from groupwise.inference.client import in_process_client
    from groupwise.inference.engine_client import connect_engine_core
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app

    from groupwise.runtime.loading import load_tokenizer

    # every arch here speaks SmolLM2's tokenizer (the tiny and Qwen-shaped models are built on it)
    engine = connect_engine_core(args.frontend, load_tokenizer("smollm2-135m"))
    app = create_app(ModelRegistry(engine, base_name="m"))
    n = int(args.requests)

    async def chats() -> tuple[float, float, int]:
        async with in_process_client(app) as client:
            await chat_round(client, 2, 4)  # warm-up: this process's first template, tokenising and client
            print("ready", flush=True)
            sys.stdin.readline()
            start = time.time()
            _, tokens = await chat_round(client, n, args.tokens)
            return start, time.time(), tokens

    try:
        start, end, tokens = asyncio.run(chats())
    finally:
        engine.close()
    print(json.dumps({"start": start, "end": end, "tokens": tokens}), flush=True)


def frontends_round(args, address: str, n: int, k: int) -> tuple[float, int]:
    """N chats through K frontend processes of the core at `address`, started together: (wall s, tokens)."""
    import json
    import subprocess

    share = [n // k + (i < n % k) for i in range(k)]
    base = [sys.executable, __file__, "--frontend", address, "--arch", args.arch, "--tokens", str(args.tokens)]
    procs = [subprocess.Popen([*base, "--requests", str(m)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for m in share]
    try:
        for proc in procs:
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a frontend did not start: {line!r}")
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [json.loads(proc.stdout.readlines()[-1]) for proc in procs]
    finally:
        for proc in procs:
            proc.wait(timeout=60)
    return max(r["end"] for r in results) - min(r["start"] for r in results), sum(r["tokens"] for r in results)


def measure_frontends(args, sizes: list[int], counts: list[int]) -> dict[tuple[int, int], list[tuple[float, int]]]:
    engine = engine_of("separate", args)
    out: dict[tuple[int, int], list[tuple[float, int]]] = {}
    try:
        for n in sizes:
            for k in counts:
                out.setdefault((n, k), []).append(frontends_round(args, engine.address, n, k))
    finally:
        engine.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--arch", default="tiny", help="tiny, smollm2-135m or qwen2.5-0.5b")
    p.add_argument("--requests", default="8,32", help="comma-separated N (concurrent requests)")
    p.add_argument("--tokens", type=int, default=32, help="tokens sampled per request")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="sequences the engines decode at once (default: the largest N, so every request of a "
                        "size is in flight together; fewer queues the rest and caps what both sides can show)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="torch threads (OMP_NUM_THREADS) of both engines")
    p.add_argument("--frontends", default=None, help="comma-separated K: also run each N through K frontend "
                                                     "processes of one core")
    p.add_argument("--frontend", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.frontend:
        frontend(args)
        return
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    # the core process imports this file's `load` by name
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [HERE, os.path.join(HERE, "..", "src"),
                                                             os.environ.get("PYTHONPATH")]))
    sizes = [int(x) for x in args.requests.split(",")]
    args.max_batch_size = args.max_batch_size or max(sizes)
    totals: dict[tuple[int, str, str], list[tuple[float, int]]] = {}
    for _ in range(args.repeats):
        for mode in ("in_process", "separate"):
            for (n, path), runs in measure(mode, args, sizes).items():
                totals.setdefault((n, path, mode), []).extend(runs)
    import torch

    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {os.cpu_count()} cores"
    print(f"\n{args.arch} on {card}, {args.tokens} tokens a request, at most {args.max_batch_size} decoded at once, "
          f"{args.repeats} repeats (best of each)\n")
    print("| N | path | in process req/s | separate req/s | in process tok/s | separate tok/s | separate / in process |")
    print("|---|---|---|---|---|---|---|")
    for n in sizes:
        for path in ("chat via the app", "engine.submit"):
            best = {mode: min(totals[(n, path, mode)]) for mode in ("in_process", "separate")}
            rps = {m: n / s for m, (s, _) in best.items()}
            tps = {m: t / s for m, (s, t) in best.items()}
            print(f"| {n} | {path} | {rps['in_process']:.2f} | {rps['separate']:.2f} | {tps['in_process']:.0f} | "
                  f"{tps['separate']:.0f} | {tps['separate'] / tps['in_process']:.2f}x |")
    if args.frontends:
        counts = [int(x) for x in args.frontends.split(",")]
        runs: dict[tuple[int, int], list[tuple[float, int]]] = {}
        for _ in range(args.repeats):
            for key, got in measure_frontends(args, sizes, counts).items():
                runs.setdefault(key, []).extend(got)
        print("\nThe chats through K frontend processes of one core (each its own app and client, N/K requests):\n")
        print("| N | frontends | tok/s | of one in-process app |")
        print("|---|---|---|---|")
        for n in sizes:
            s0, t0 = min(totals[(n, "chat via the app", "in_process")])
            for k in counts:
                s, t = min(runs[(n, k)])
                print(f"| {n} | {k} | {t / s:.0f} | {(t / s) / (t0 / s0):.2f}x |")


if __name__ == "__main__":
    main()
