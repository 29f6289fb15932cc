"""Local inference: a batching engine on transformers, served through an OpenAI-compatible API.

Data flow (each file's docstring says more)::

    openai.AsyncOpenAI ──► client.py (httpx ASGI transport, in process) or HTTP (`groupwise serve`)
        ──► server.py   FastAPI: /v1/chat/completions (+SSE), /v1/completions, /v1/models, errors
        ──► registry.py served names "name", "name@step", "name@0" -> engine adapter
            (groupwise.chat renders messages and tools into the prompt, and parses <tool_call> text
             back into OpenAI tool_calls: the trainer renders with it too)
            constrained.py response_format / forced tool_choice -> llguidance token masks
        ──► engine.py   continuous batching on the compute thread, per-request LoRA adapters
            requests.py GenerationRequest / GenerationResult (re-exported by engine.py)
            step_state.py what a step works on: queues, slot cache, counters
            runner.py   the model and its forward pass: adapter slots, merged weights, CUDA graphs
            prefill.py  admission and prefill of new requests (prefix hits, shared-prefix warm-up)
            decode.py   the decode step: one token for every running sequence
            advance.py  after a pass: sampling, stops, retiring finished rows, answering callers
            prefix_cache.py KV of prompt prefixes seen before, copied instead of recomputed
            kv_cache.py slot KV cache (one preallocated row per running sequence)
            decode_graphs.py the decode step as CUDA graphs (per batch/length bucket, adapter), sampling in the graph
            attention.py decode attention reading each K/V head once for its query heads
            merged.py   one adapter served from merged weights (CPU)
            sampling.py temperature / top-p / seeds; raw logprobs (why: see there)
    vllm_engine.py      the same interface on vLLM (optional, GPU)

Nothing here is imported by `import groupwise`; importing these modules imports torch.
"""
