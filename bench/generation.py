"""Generation throughput: the groupwise engine vs plain `model.generate` on the same prompts.

CPU (default): SmolLM2-135M fp32 on the packaged weights::

    python bench/generation.py                       # 32 requests x 64 tokens + 18 multi-turn rollouts
    python bench/generation.py --requests 32 --tokens 64 --no-rollouts
    python bench/generation.py --threads 1 --no-rollouts   # on a CPU other jobs share (see below)

Each size runs `--repeats` (2) timed pairs, engine then padded-batch `generate`, alternated, so a load
change hits both sides of a ratio; each engine run starts with an empty prefix cache. On a machine
whose cores other jobs use, pass `--threads 1`: with 2 threads on 2 busy cores OpenMP threads wait on
each other and a decode step swings from 0.2 s to 1.5 s between runs.

GPU (an H100 or H200; docs/benchmarks.md has the figures)::

    python bench/generation.py --device cuda --arch qwen2.5-0.5b --requests 64,256 --tokens 256

`--arch qwen2.5-0.5b` is a randomly initialised Qwen2.5-0.5B-shaped model (bf16 on CUDA) with
SmolLM2's tokenizer (vocab 49152). Every request generates exactly `--tokens` tokens (EOS ignored) in
every contender, sampled at temperature 1, so tok/s compare the same work. Printed per size:
engine tok/s; plain `generate` one request at a time (on a subset, tok/s is per-token so it
extrapolates); plain `generate` on one left-padded batch; on CUDA also `generate` with
``cache_implementation="static"`` (transformers compiles the decode step then); the ratios; and on
CUDA the fraction of the memory-bandwidth bound (a decode step must read every weight once:
bound tok/s = batch x bandwidth / weight bytes; KV reads ignored, so the bound is optimistic).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from groupwise.runtime.compute import compute_thread  # noqa: E402
from groupwise.inference.engine import Engine, GenerationRequest  # noqa: E402
from groupwise.inference.sampling import SamplingParams  # noqa: E402
from groupwise.runtime.loading import load_base_model, load_tokenizer, resolve_device, resolve_dtype  # noqa: E402

TOPICS = ["the sea", "a cat", "databases", "the moon", "bread", "chess", "rain", "trains", "music", "tea",
          "volcanoes", "bees", "winter", "maps", "clocks", "rivers", "robots", "gardens"]

BANDWIDTH_TBS = {"H100": 3.35, "H200": 4.8, "A100": 2.0}

# tok/s of the last timed run per second of this process's CPU time (all threads). On a CPU that other
# jobs share, wall time includes the time slices they took; CPU time does not (caches are still shared).
LAST_CPU_TOKS = [0.0]


def build_model(arch: str, device: torch.device, dtype: torch.dtype):
    if arch == "smollm2-135m":
        return load_base_model("smollm2-135m", device=device, dtype=dtype)
    if arch == "qwen2.5-0.5b":
        from transformers import AutoModelForCausalLM, Qwen2Config

        tok = load_tokenizer("smollm2-135m")
        config = Qwen2Config(vocab_size=len(tok), hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                             tie_word_embeddings=True, rope_theta=1000000.0, bos_token_id=tok.bos_token_id,
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
        return model, tok
    raise SystemExit(f"unknown --arch {arch!r}; use smollm2-135m or qwen2.5-0.5b")


def make_prompts(tok, k: int) -> list[list[int]]:
    return [tok.apply_chat_template([{"role": "user", "content": f"Write a short story about {TOPICS[i % len(TOPICS)]}"
                                      f" (number {i})."}], add_generation_prompt=True, tokenize=True,
                                    return_dict=True)["input_ids"] for i in range(k)]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_engine(engine: Engine, prompts, tokens: int) -> float:
    async def go():
        reqs = [engine.generate(GenerationRequest(p, max_new_tokens=tokens, ignore_eos=True,
                                                  sampling=SamplingParams(seed=i))) for i, p in enumerate(prompts)]
        return await asyncio.gather(*reqs)

    t, cpu = time.perf_counter(), time.process_time()
    results = asyncio.run(go())
    sync(engine.device)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    assert all(len(r.completions[0].token_ids) == tokens for r in results)
    LAST_CPU_TOKS[0] = len(prompts) * tokens / cpu
    return len(prompts) * tokens / wall


def run_generate(model, tok, prompts, tokens: int, **kwargs) -> float:
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    t, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=pad, **kwargs)
    sync(device)
    wall, cpu = time.perf_counter() - t, time.process_time() - cpu
    assert out.shape[1] - width == tokens
    LAST_CPU_TOKS[0] = len(prompts) * tokens / cpu
    return len(prompts) * tokens / wall


def run_sequential(model, tok, prompts, tokens: int) -> float:
    t = time.perf_counter()
    for p in prompts:
        run_generate(model, tok, [p], tokens)
    return len(prompts) * tokens / (time.perf_counter() - t)


def bench_sizes(args, model, tok, device):
    rows = []
    C = compute_thread()  # `generate` runs where the engine steps (groupwise/runtime/compute.py: one OpenMP team)
    for k in [int(x) for x in args.requests.split(",")]:
        prompts = make_prompts(tok, k)
        engine = Engine(model, tok, max_batch_size=max(k, 1), max_new_tokens_default=args.tokens,
                        cuda_graphs=False if args.no_cuda_graphs else None,
                        initial_capacity=max(len(p) for p in prompts) + args.tokens + 8,
                        prefix_cache_tokens=0 if args.no_prefix_cache else 4096,
                        batch_invariant=args.batch_invariant, fuse_decode=False if args.no_fuse else None)
        seq_n = min(k, args.sequential_subset)
        try:
            run_engine(engine, prompts[: min(k, 4)], 4)  # warm-up (on CUDA: captures a few graphs)
            if device.type == "cuda":
                run_engine(engine, prompts, args.tokens)  # capture every bucket this size meets
            C.call(run_generate, model, tok, prompts[:1], 2)  # warm-up
            seq = C.call(run_sequential, model, tok, prompts[:seq_n], args.tokens)
            # Engine and padded-batch generate alternate, so a change of load on a shared machine
            # hits both sides of a ratio alike.
            for _ in range(args.repeats):
                engine.state.forget_prefixes()  # every timed run starts cold: no prompt of an earlier run is cached
                before = (engine.stats.prefill_tokens, engine.stats.prefix_hit_tokens, engine.stats.warm_passes)
                eng = run_engine(engine, prompts, args.tokens)
                eng_cpu = LAST_CPU_TOKS[0]
                stats = [now - b for now, b in zip((engine.stats.prefill_tokens, engine.stats.prefix_hit_tokens, engine.stats.warm_passes), before)]
                batch = C.call(run_generate, model, tok, prompts, args.tokens)
                row = {"requests": k, "engine": eng, "sequential": seq, "batch": batch, "prefill": stats}
                if device.type == "cpu":
                    row["cpu"] = (eng_cpu, LAST_CPU_TOKS[0])
                if device.type == "cuda" and not args.no_static:
                    C.call(run_generate, model, tok, prompts, args.tokens, cache_implementation="static")  # compile, warm-up
                    row["static"] = C.call(run_generate, model, tok, prompts, args.tokens, cache_implementation="static")
                rows.append(row)
                print_row(row, args, model, device, seq_n)
        finally:
            engine.close()
    return rows


def print_row(row, args, model, device, seq_n):
    line = (f"{row['requests']:>4} req x {args.tokens} tok | engine {row['engine']:9.1f} tok/s | "
            f"generate 1-at-a-time {row['sequential']:8.1f} (on {seq_n}) | generate batch {row['batch']:9.1f} | "
            f"engine/batch {row['engine'] / row['batch']:5.2f}x | engine/1-at-a-time {row['engine'] / row['sequential']:6.2f}x")
    if "cpu" in row:
        e, b = row["cpu"]
        line += f" | per CPU-second: engine {e:7.1f} batch {b:7.1f} = {e / b:5.2f}x"
    run, hit, warm = row["prefill"]
    line += f" | engine prompt tokens run {run}, from the prefix cache {hit} ({warm} warm pass)"
    if "static" in row:
        line += f" | static-cache compiled {row['static']:9.1f} | engine/static {row['engine'] / row['static']:5.2f}x"
    if device.type == "cuda":
        name = torch.cuda.get_device_name()
        bw = args.bandwidth_tbs or next((v for k, v in BANDWIDTH_TBS.items() if k in name), None)
        if bw:
            weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
            bound = row["requests"] * bw * 1e12 / weight_bytes
            line += f" | {name}: {row['engine'] / bound:6.1%} of the bandwidth bound ({bound:,.0f} tok/s)"
    print(line, flush=True)


def bench_rollouts(args, model, tok, device, n_rollouts=18, turns=3, tokens=32):
    """18 concurrent multi-turn chats through the real OpenAI client and in-process app."""
    from groupwise.inference.client import in_process_client
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app

    engine = Engine(model, tok, max_batch_size=32)
    app = create_app(ModelRegistry(engine, base_name="m"))

    async def rollout(client, i):
        messages = [{"role": "user", "content": f"Let's talk about {TOPICS[i % len(TOPICS)]}."}]
        produced = 0
        for turn in range(turns):
            r = await client.chat.completions.create(model="m", messages=messages, max_tokens=tokens, seed=i * 10 + turn)
            produced += r.usage.completion_tokens
            messages += [{"role": "assistant", "content": r.choices[0].message.content},
                         {"role": "user", "content": "Tell me more."}]
        return produced, messages

    async def go():
        client = in_process_client(app)
        return await asyncio.gather(*[rollout(client, i) for i in range(n_rollouts)])

    t = time.perf_counter()
    results = asyncio.run(go())
    wall = time.perf_counter() - t
    engine.close()
    total = sum(p for p, _ in results)
    # Baseline: the same turns, one rollout at a time, plain generate per turn (on a subset).
    subset = results[: args.sequential_subset]

    def baseline() -> int:
        produced = 0
        for _, messages in subset:
            for turn in range(turns):
                history = messages[: 1 + 2 * turn]
                p = tok.apply_chat_template(history, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
                ids = torch.tensor([p], device=device)
                with torch.inference_mode():
                    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                                         do_sample=True, top_k=0, pad_token_id=tok.pad_token_id)
                produced += out.shape[1] - len(p)
        return produced

    t2 = time.perf_counter()
    base_tokens = compute_thread().call(baseline)
    base = base_tokens / (time.perf_counter() - t2)
    print(f"{n_rollouts} rollouts x {turns} turns (<= {tokens} tok/turn, via the openai client) | engine "
          f"{total / wall:8.1f} tok/s ({total} tokens, {wall:.1f} s) | generate 1-at-a-time {base:8.1f} tok/s "
          f"(on {len(subset)} rollouts) | ratio {total / wall / base:5.2f}x | engine prompt tokens run "
          f"{engine.stats.prefill_tokens}, from the prefix cache {engine.stats.prefix_hit_tokens}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--arch", default="smollm2-135m", help="smollm2-135m (real weights) or qwen2.5-0.5b (random)")
    ap.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    ap.add_argument("--requests", default="32", help="comma-separated request counts")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--sequential-subset", type=int, default=4, help="requests timed one at a time")
    ap.add_argument("--no-rollouts", action="store_true", help="skip the 18 multi-turn rollouts")
    ap.add_argument("--no-static", action="store_true", help="skip the static-cache generate baseline (CUDA)")
    ap.add_argument("--bandwidth-tbs", type=float, default=None, help="memory bandwidth in TB/s (default: by GPU name)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly on CUDA (to isolate graph issues)")
    ap.add_argument("--no-fuse", action="store_true", help="capture the decode graphs unfused (Engine(fuse_decode=False)): the baseline of the fusion")
    ap.add_argument("--no-prefix-cache", action="store_true", help="engine without its prefix cache (prefix_cache.py)")
    ap.add_argument("--batch-invariant", action="store_true", help="CPU: the engine in batch-invariant mode (a "
                    "request's numbers do not depend on its batch; what `groupwise train --batch-invariant` runs)")
    ap.add_argument("--repeats", type=int, default=2, help="timed engine / generate-batch pairs per size, alternated")
    args = ap.parse_args(argv)
    if args.threads:
        compute_thread().call(torch.set_num_threads, args.threads)  # OpenMP's thread count is per thread
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    model, tok = compute_thread().call(build_model, args.arch, device, dtype)
    print(f"# {args.arch} {dtype} on {device} ({torch.cuda.get_device_name() if device.type == 'cuda' else f'{torch.get_num_threads()} threads'})")
    bench_sizes(args, model, tok, device)
    if not args.no_rollouts and device.type == "cpu":
        bench_rollouts(args, model, tok, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
