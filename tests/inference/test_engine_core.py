"""The engine core in a process of its own (inference/engine_core.py) and its frontends (engine_client.py),
as real processes over real ZeroMQ sockets, on the tiny random model: greedy generation through the core
equals the in-process engine's token for token; streaming; abort; adapters published as messages; two
frontend processes on one core; a request over the core's memory limit is refused as such; a frontend
killed with SIGKILL has its requests freed while the others go on; a core killed fails every pending request at once with `EngineProcessDied` naming its exit code; and
the real `openai` client against `groupwise serve --engine-process separate`; where "auto" puts the engine.
Several frontends serving one port: test_frontends.py."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from polling import wait_for
from hypothesis import given, settings
from hypothesis import strategies as st

from groupwise.inference.engine_client import EngineProcessDied, start_engine_core
from groupwise.inference.requests import EngineError, GenerationRequest, PromptTooLongError
from groupwise.inference.sampling import SamplingParams

PROMPTS = [[1, 2, 3, 4, 5], [17, 300, 2048, 9, 9, 9]]
HERE = Path(__file__).parent


class Core:
    """The module's core process and its frontend here; started again if a test killed it."""

    def __init__(self, model_dir: str, tokenizer) -> None:
        self.model_dir, self.tokenizer, self.client = model_dir, tokenizer, None

    def get(self):
        if self.client is None or self.client.closed:
            self.client = start_engine_core(self.model_dir, tokenizer=self.tokenizer, device="cpu",
                                            engine_kwargs={"max_batch_size": 8, "max_new_tokens_default": 16})
        return self.client

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


@pytest.fixture(scope="module")
def core(tiny_model_dir, tiny):
    holder = Core(tiny_model_dir, tiny[1])
    yield holder
    holder.close()


@pytest.fixture(scope="module")
def local_engine(tiny_model_dir):
    from groupwise.inference.engine import Engine
    from groupwise.runtime.loading import load_base_model

    model, tok = load_base_model(tiny_model_dir, device="cpu")
    engine = Engine(model, tok, max_batch_size=8, max_new_tokens_default=16)
    yield engine
    engine.close()


def greedy(prompt, adapter=None, **kw) -> GenerationRequest:
    return GenerationRequest(list(prompt), max_new_tokens=kw.pop("max_new_tokens", 12),
                             sampling=SamplingParams(temperature=0, top_logprobs=2), adapter=adapter, **kw)


def test_greedy_through_the_core_equals_the_in_process_engine(core, local_engine, adapter_dirs):
    client = core.get()
    version = client.version
    client.add_adapter("agent@1", adapter_dirs[1])  # a policy version published as a message
    local_engine.add_adapter("agent@1", adapter_dirs[1])
    assert "agent@1" in client.adapters() and client.version == version + 1
    answers = {}
    try:
        for adapter in (None, "agent@1"):
            for prompt in PROMPTS:
                remote = client.submit(greedy(prompt, adapter)).result()
                answers[adapter, tuple(prompt)] = remote.completions[0].token_ids
                local = local_engine.submit(greedy(prompt, adapter)).result()
                assert remote.prompt_tokens == local.prompt_tokens == len(prompt)
                assert remote.adapter == local.adapter == adapter
                (r,), (lo,) = remote.completions, local.completions
                assert r.token_ids == lo.token_ids and len(r.token_ids) == 12
                assert r.logprobs == pytest.approx(lo.logprobs, abs=1e-5)
                assert [[t for t, _ in top] for top in r.top_logprobs] == [[t for t, _ in top] for top in lo.top_logprobs]
                assert (r.text, r.finish_reason, r.adapters) == (lo.text, lo.finish_reason, lo.adapters)
        # the adapter changes the answers, so the comparison above did compare two policies
        assert all(answers[None, tuple(p)] != answers["agent@1", tuple(p)] for p in PROMPTS)
    finally:
        client.remove_adapter("agent@1")
        local_engine.remove_adapter("agent@1")
    assert "agent@1" not in client.adapters()


def test_adapter_published_as_weights_serves_the_same_tokens(core, adapter_dirs):
    from peft import LoraConfig
    from safetensors.torch import load_file

    client = core.get()
    client.add_adapter("by-path", adapter_dirs[2])
    config = LoraConfig.from_pretrained(adapter_dirs[2])
    client.add_adapter("by-bytes", weights=load_file(f"{adapter_dirs[2]}/adapter_model.safetensors"), config=config)
    try:
        a = client.submit(greedy(PROMPTS[1], "by-path")).result().completions[0]
        b = client.submit(greedy(PROMPTS[1], "by-bytes")).result().completions[0]
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    finally:
        client.remove_adapter("by-path")
        client.remove_adapter("by-bytes")


def test_caller_errors_raise_at_submit_and_the_core_refuses_what_it_alone_knows(core):
    client = core.get()
    with pytest.raises(PromptTooLongError, match="context length is 2048"):
        client.submit(greedy([1] * 2048))
    with pytest.raises(EngineError, match="outside"):
        client.submit(greedy([client.vocab_size]))
    with pytest.raises(EngineError, match="not loaded"):
        client.submit(greedy([1, 2], "nobody@3"))
    with pytest.raises(EngineError, match="not loaded"):  # the core's own refusal, sent back as a reply
        client.remove_adapter("nobody@3")
    assert client.submit(greedy([1, 2])).result().completions[0].token_ids  # and it keeps serving


def test_a_request_the_cores_memory_limit_refuses_is_a_memory_error_at_the_frontend(local_engine, tiny_model_dir, tiny):
    """The core's refusal crosses the socket as what it is (`RequestMemoryError`: the server's 400 naming
    max_tokens), not a generic engine failure."""
    import concurrent.futures

    from groupwise.inference.requests import RequestMemoryError, RequestState

    def price(max_new: int) -> int:
        request = greedy([1, 2, 3], max_new_tokens=max_new)
        return local_engine.state.price([RequestState(request, concurrent.futures.Future(), max_new)], alone=True).total

    limit = (price(12) + price(2000)) // 2
    client = start_engine_core(tiny_model_dir, tokenizer=tiny[1], device="cpu",
                               engine_kwargs={"max_batch_size": 8, "memory_limit_bytes": limit})
    try:
        with pytest.raises(RequestMemoryError, match="max_tokens 2000"):
            client.submit(greedy([1, 2, 3], max_new_tokens=2000)).result(timeout=120)
        assert client.submit(greedy([1, 2, 3])).result(timeout=120).completions[0].token_ids
    finally:
        client.close()


def test_streaming_sends_every_token_in_order_before_the_result(core):
    client = core.get()
    seen: list[tuple[int, int, float, str | None]] = []
    request = GenerationRequest([5, 6, 7], max_new_tokens=20, n=2, ignore_eos=True, sampling=SamplingParams(seed=7),
                                on_token=lambda *event: seen.append(event))
    result = client.submit(request).result()
    for c in result.completions:
        mine = [e for e in seen if e[0] == c.index]
        assert [t for _, t, _, _ in mine] == c.token_ids and len(c.token_ids) == 20
        assert [lp for _, _, lp, _ in mine] == c.logprobs
        assert [f for *_, f in mine] == [None] * 19 + ["length"]


def test_a_raising_on_token_fails_its_request_only(core):
    from groupwise.inference.requests import RequestFailedError

    client = core.get()

    def boom(*_):
        raise ValueError("callback bug")

    bad = client.submit(GenerationRequest([8, 9], max_new_tokens=100_000, ignore_eos=True, on_token=boom))
    good = client.submit(greedy([8, 9]))
    with pytest.raises(RequestFailedError, match="on_token callback raised ValueError: callback bug"):
        bad.result(timeout=60)
    assert len(good.result(timeout=60).completions[0].token_ids) == 12
    wait_for(lambda: (s := client.status()).requests == 0 and s.running == 0, "the failed request stopped in the core")


def test_connecting_where_no_core_runs_fails_with_a_clear_error(tmp_path):
    from groupwise.inference.engine_client import EngineCoreClient

    with pytest.raises(EngineError, match="no engine core answered at ipc://.* within 0.5 s"):
        EngineCoreClient(f"ipc://{tmp_path}/none", tokenizer=None, connect_timeout_s=0.5)


def test_abort_frees_the_request_in_the_core(core):
    client = core.get()
    before = client.status()
    first = threading.Event()
    future = client.submit(GenerationRequest([3, 4], max_new_tokens=100_000, ignore_eos=True, n=3,
                                             on_token=lambda *_: first.set()))
    assert first.wait(60)
    assert client.status().running == 3
    future.cancel()
    after = wait_for(lambda: (s := client.status()).requests == 0 and s.running == 0 and s, "the aborted rows retired")
    assert after.cancelled == before.cancelled + 1
    assert client.submit(greedy([1, 2])).result().completions[0].finish_reason == "length"


def test_two_frontend_processes_share_a_core_and_a_killed_one_is_freed(core):
    client = core.get()
    prompt = PROMPTS[1]
    before = client.status()
    proc = subprocess.Popen([sys.executable, str(HERE / "core_frontend.py"), client.address, ",".join(map(str, prompt))],
                            stdout=subprocess.PIPE, text=True)
    try:
        other_tokens = proc.stdout.readline().strip()
        mine = client.submit(greedy(prompt)).result().completions[0].token_ids
        assert other_tokens == ",".join(map(str, mine))  # the other process's frontend got the same answer
        assert proc.stdout.readline().strip() == "running"
        assert client.status().frontends == 2 and client.status().running == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        after = wait_for(lambda: (s := client.status()).frontends == 1 and s.running == 0 and s,
                         "the dead frontend's requests freed")
        assert after.cancelled == before.cancelled + 1 and after.requests == 0
        # the core and this frontend go on
        assert client.submit(greedy(prompt)).result().completions[0].token_ids == mine
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_core_fails_every_pending_request_with_its_exit_code(core):
    client = core.get()
    first = threading.Event()
    futures = [client.submit(GenerationRequest([1, 2, 3], max_new_tokens=100_000, ignore_eos=True,
                                               on_token=lambda *_: first.set())) for _ in range(3)]
    assert first.wait(60)
    os.kill(client.core_pid, signal.SIGKILL)
    for future in futures:
        with pytest.raises(EngineProcessDied, match=r"engine core process \(pid \d+\) died, exit code -9 \(killed by SIGKILL\)"):
            future.result(timeout=30)  # promptly, never a hang
    assert client.closed
    with pytest.raises(EngineProcessDied):
        client.submit(greedy([1, 2]))
    with pytest.raises(EngineProcessDied):
        client.add_adapter("x", "/nowhere")
    folder = os.path.dirname(client.address.removeprefix("ipc://"))
    assert os.path.isdir(folder)  # a killed core leaves its socket's folder behind
    client.close()
    assert not os.path.exists(folder)  # its frontend removes it


@pytest.fixture
def separate_server(tiny_model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "groupwise.cli", "serve", "--model", tiny_model_dir, "--name", "agent",
                             "--device", "cpu", "--port", str(port), "--max-batch-size", "8", "--max-kv-gb", "0.01",
                             "--engine-process", "separate"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        core = wait_for(lambda: next((ln.split() for ln in lines if ln.startswith("engine core: pid")), None)
                                or (proc.poll() is not None and pytest.fail("".join(lines)[-3000:])),
                        "groupwise serve started its core", limit_s=180)
        core_pid, address = int(core[3]), core[5]
        wait_for(lambda: any("Uvicorn running" in ln or "Application startup complete" in ln for ln in lines)
                 or (proc.poll() is not None and pytest.fail("".join(lines)[-3000:])), "the server listens", limit_s=180)
        yield f"http://127.0.0.1:{port}/v1", proc, core_pid, address
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_openai_client_against_serve_with_a_separate_core(separate_server, local_engine, tiny):
    import openai

    from groupwise.chat import prompt_ids

    import httpx

    from groupwise.inference.engine_client import connect_engine_core

    url, proc, core_pid, address = separate_server
    messages = [{"role": "user", "content": "Say something."}]
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0) as client:
        answer = await client.chat.completions.create(model="agent", messages=messages, max_tokens=10, temperature=0,
                                                      logprobs=True)
        choice = answer.choices[0]
        ids = choice.model_extra["token_ids"]
        expected = local_engine.submit(GenerationRequest(prompt_ids(tiny[1], messages, None), max_new_tokens=10,
                                                         sampling=SamplingParams(temperature=0))).result()
        assert ids == expected.completions[0].token_ids and answer.model == "agent@0"
        assert [e.logprob for e in choice.logprobs.content] == pytest.approx(expected.completions[0].logprobs, abs=1e-5)
        stream = await client.chat.completions.create(model="agent", messages=messages, max_tokens=10, temperature=0,
                                                      stream=True)
        streamed = [t async for chunk in stream for c in chunk.choices for t in (c.model_extra.get("token_ids") or [])]
        assert streamed == ids
        with pytest.raises(openai.BadRequestError, match="context"):
            await client.completions.create(model="agent", prompt=[1] * 3000, max_tokens=2)
    # A client that hangs up mid-stream: the server aborts its request in the core (seen by a second
    # frontend of the same core, from this process).
    watcher = connect_engine_core(address, tokenizer=tiny[1])
    try:
        before = watcher.status()
        async with httpx.AsyncClient(timeout=60) as http:
            async with http.stream("POST", f"{url}/chat/completions", json={
                    "model": "agent", "messages": messages, "max_tokens": 100_000, "stream": True, "ignore_eos": True}) as r:
                async for line in r.aiter_lines():
                    if '"token_ids"' in line:
                        break  # tokens are flowing: hang up
        after = wait_for(lambda: (s := watcher.status()).requests == 0 and s.running == 0 and s, "the request aborted")
        # the server's own client of its core (its supervisor), its one frontend and this one
        assert after.cancelled == before.cancelled + 1 and after.frontends == 3
    finally:
        watcher.close()
    # The server killed outright: its core sees its owner gone and exits (nothing left holding the device).
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    from groupwise.inference.engine_core import pid_exit

    wait_for(lambda: not pid_exit(core_pid)[0], "the orphaned core exited")


def test_auto_keeps_the_engine_in_process_on_the_cpu_and_separates_it_with_several_frontends_on_cuda():
    from groupwise.errors import ConfigError
    from groupwise.inference.engine_core import Placement, resolve_engine_process

    assert resolve_engine_process("auto", "cpu") == resolve_engine_process(None, "cpu", "auto") == ("in_process", 1)
    # CUDA: one CPU left to the core, at most the four frontends measured
    assert resolve_engine_process("auto", "cuda", cpus=16) == Placement("separate", 4)
    assert resolve_engine_process(None, "cuda", cpus=3) == ("separate", 2)
    assert resolve_engine_process("auto", "cuda", cpus=1) == ("separate", 1)
    assert resolve_engine_process("separate", "cpu") == ("separate", 1)
    assert resolve_engine_process("separate", "cuda", cpus=8) == ("separate", 4)
    assert resolve_engine_process("in_process", "cuda") == ("in_process", 1)
    # a number is obeyed, and takes the engine out of process
    assert resolve_engine_process("auto", "cpu", "3") == resolve_engine_process("separate", "cuda", 3) == ("separate", 3)
    assert resolve_engine_process("auto", "cuda", "1", cpus=16) == ("separate", 1)
    assert resolve_engine_process("in_process", "cpu", 1) == ("in_process", 1)
    with pytest.raises(ConfigError, match="frontends=2 needs the engine in a core process of its own: drop "
                                          "--engine-process in_process"):
        resolve_engine_process("in_process", "cuda", 2)
    with pytest.raises(ConfigError, match="engine_process='elsewhere' must be one of"):
        resolve_engine_process("elsewhere", "cpu")
    with pytest.raises(ConfigError, match=r"frontends must be 'auto' or a whole number of processes from 1 \(e.g. 4\), got '0'"):
        resolve_engine_process("auto", "cuda", 0)


def test_the_serve_job_takes_the_settings_from_the_command_line():
    from groupwise.cli import build_parser, main
    from groupwise.jobs.serve import ServeJob

    parser = build_parser()
    assert ServeJob(model="smollm2-135m").engine_process == "auto" and ServeJob(model="smollm2-135m").frontends == "auto"
    assert parser.parse_args(["serve", "--model", "m", "--engine-process", "separate"]).engine_process == "separate"
    assert parser.parse_args(["serve", "--model", "m", "--frontends", "4"]).frontends == "4"
    for bad in (["--engine-process", "elsewhere"], ["--frontends", "many"], ["--frontends", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", "--model", "m", *bad])
    # refused before anything loads, saying what to do
    assert main(["serve", "--model", "smollm2-135m", "--engine-process", "in_process", "--frontends", "2"]) == 2


def test_every_field_of_a_request_crosses_the_wire():
    """A field added to GenerationRequest or SamplingParams must cross to the core (or be named here as
    the frontend's own), never be dropped silently."""
    import dataclasses

    from groupwise.inference import wire

    assert {f.name for f in dataclasses.fields(SamplingParams)} == set(wire.Sampling.__struct_fields__)
    carried = set(wire.AddRequest.__struct_fields__) | {"sampling", "prompt_ids"}
    as_other = {"on_token": "stream", "constraint": "grammar"}  # a callback and a matcher factory cannot cross
    for f in dataclasses.fields(GenerationRequest):
        assert f.name in carried or as_other.get(f.name) in carried, f.name


@settings(max_examples=50, deadline=None)
@given(ids=st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=50), stop=st.lists(st.text(max_size=5), max_size=3),
       seed=st.none() | st.integers(-(2**63), 2**63 - 1), adapter=st.none() | st.text(max_size=20),
       temperature=st.floats(0, 2), stream=st.booleans())
def test_a_request_crosses_the_wire_unchanged(ids, stop, seed, adapter, temperature, stream):
    from groupwise.inference import wire

    message = wire.AddRequest(7, ids, wire.Sampling(temperature, 0.9, seed, 2, 0, 0.0, 1.0, 0.0, 0.0), None, 2, stop, [],
                              False, adapter, None, None, "", stream)
    assert wire.decode_to_core(wire.encode(message)) == message
    out = wire.Outputs([wire.Delta(7, 1, ids, [-0.5] * len(ids), None)], [], [wire.Failed(7, "engine", "x")])
    assert wire.decode_from_core(wire.encode(out)) == out
