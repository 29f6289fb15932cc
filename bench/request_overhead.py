"""What a rollout's chat request costs in Python, client and server, with the engine's work taken away.

    python bench/request_overhead.py [--requests 256] [--tokens 128] [--rounds 6]

A `LocalBackend` on the CPU serves a tiny random model; one real request is answered by its engine, and
from then on the engine's `submit` returns that answer at once (a stub at the engine's seam). What is left
of each of --requests concurrent `chat.completions.create` calls through `model.openai_client()` is the
`openai` SDK's work, the in-process HTTP hop and the server's (FastAPI, the chat template, tokenising the
prompt, building the response): what the process that also steps the engine spends per rollout request.

Rounds alternate two states of the garbage collector: what the backend loaded frozen out of its sight (as
the worker leaves it after a load, runtime/memory.py) and everything thawed (the baseline, as before the
freeze). Printed per state: the best, median and mean milliseconds a request, the collector's seconds in
all rounds and its full collections. A full collection walks every tracked object and stops every thread
meanwhile; frozen objects are not walked.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import copy
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


class CollectorClock:
    """Seconds spent in garbage collections, and how many were full ones, via `gc.callbacks`."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0
        self.longest = 0.0
        self._start = 0.0
        gc.callbacks.append(self.callback)

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            took = time.perf_counter() - self._start
            self.seconds += took
            self.longest = max(self.longest, took)
            self.full += info["generation"] == 2

    def take(self) -> tuple[float, int, float]:
        out = (self.seconds, self.full, self.longest)
        self.seconds, self.full, self.longest = 0.0, 0, 0.0
        return out


async def run(args: Any) -> dict[str, list[tuple[float, float, int, float]]]:
    import groupwise as gw
    from many_runs import random_model

    backend = gw.LocalBackend(path=tempfile.mkdtemp(prefix="gw-requests-"), device="cpu", best_checkpoint_metric=None,
                              serve_http=False, load_model=random_model, max_batch_size=args.requests)
    model = gw.TrainableModel("requests", project="bench", base_model="random:tiny-qwen")
    await model.register(backend)
    client = model.openai_client()
    # the app behind the in-process client, and its engine (a bench's look inside: no API hands it out)
    engine = client._client._transport.app.state.gw.engine

    async def ask(i: int) -> Any:
        return await client.chat.completions.create(
            model=model.inference_name(), max_tokens=args.tokens, temperature=1.0, seed=i,
            messages=[{"role": "user", "content": f"Question {i}: what is the capital of country number {i}?"}])

    real_submit = engine.submit
    answers: list[Any] = []

    def keep_answer(request: Any) -> concurrent.futures.Future:
        future = real_submit(request)
        future.add_done_callback(lambda f: answers.append(f.result()))
        return future

    engine.submit = keep_answer
    await ask(0)
    answer = answers[0]

    def answered(request: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(copy.copy(answer))
        return future

    engine.submit = answered
    clock = CollectorClock()
    results: dict[str, list[tuple[float, float, int, float]]] = {"frozen": [], "thawed": []}
    try:
        for r in range(2 * args.rounds):
            state = "frozen" if r % 2 == 0 else "thawed"
            if state == "frozen":
                gc.collect()
                gc.freeze()
            else:
                gc.unfreeze()
            clock.take()
            t0 = time.perf_counter()
            await asyncio.gather(*(ask(i) for i in range(args.requests)))
            ms = (time.perf_counter() - t0) * 1e3 / args.requests
            seconds, full, longest = clock.take()
            results[state].append((ms, seconds, full, longest))
            print(f"  round {r // 2 + 1} {state:>6}: {ms:.2f} ms a request, collector {seconds:.3f} s "
                  f"({full} full)", flush=True)
    finally:
        engine.submit = real_submit
        gc.callbacks.remove(clock.callback)
        await backend.close()
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=256, help="concurrent requests a round")
    p.add_argument("--tokens", type=int, default=128, help="max_tokens of each (the stub's answer has this many)")
    p.add_argument("--rounds", type=int, default=6, help="rounds of each collector state, alternating")
    args = p.parse_args()
    sys.path.insert(0, str(HERE))
    results = asyncio.run(run(args))
    print(f"\n{args.requests} concurrent chat requests of {args.tokens} tokens, the engine stubbed; "
          f"{args.rounds} rounds each:")
    print("| heap | best ms a request | median | mean | collector s, all rounds | full collections | longest collection s |")
    print("|---|---|---|---|---|---|---|")
    for state, rows in results.items():
        ms = [r[0] for r in rows]
        print(f"| {state} | {min(ms):.2f} | {statistics.median(ms):.2f} | {statistics.mean(ms):.2f} | "
              f"{sum(r[1] for r in rows):.3f} | {sum(r[2] for r in rows)} | {max(r[3] for r in rows):.3f} |")
    frozen = statistics.mean(r[0] for r in results["frozen"])
    thawed = statistics.mean(r[0] for r in results["thawed"])
    print(f"thawed / frozen (mean): {thawed / frozen:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
