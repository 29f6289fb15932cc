"""A frontend process of an engine core, for tests/inference/test_engine_core.py: connects to the core at
argv[1], generates greedily from the prompt argv[2] (comma-separated ids) and prints the token ids as one
line, then starts a long streamed request, prints "running" once its first token came, and waits to be
killed."""

from __future__ import annotations

import sys
import threading

from groupwise.inference.engine_client import connect_engine_core
from groupwise.inference.requests import GenerationRequest
from groupwise.inference.sampling import SamplingParams


def main() -> None:
    client = connect_engine_core(sys.argv[1], tokenizer=None)
    prompt = [int(t) for t in sys.argv[2].split(",")]
    result = client.submit(GenerationRequest(prompt, max_new_tokens=12, sampling=SamplingParams(temperature=0))).result()
    print(",".join(map(str, result.completions[0].token_ids)), flush=True)
    first = threading.Event()
    client.submit(GenerationRequest(prompt, max_new_tokens=100_000, ignore_eos=True, n=2,
                                    on_token=lambda *_: first.set()))
    first.wait()
    print("running", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
