"""The server under hostile use, over real HTTP (uvicorn on loopback, the real `openai` client where
a user would use it): one bad request harms nobody, every caller error is a 4xx naming what to fix,
a 500 keeps the connection and is not retried, bodies are bounded, a client that goes away stops
its generation, and vLLM's sampling extras work through ``extra_body``."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from live_server import LiveServer

USER = [{"role": "user", "content": "Say something."}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def _error(exc: openai.APIStatusError) -> dict:
    return exc.body if "message" in exc.body else exc.body["error"]


async def _status(coro) -> tuple[int, dict | None]:
    try:
        await coro
        return 200, None
    except openai.APIStatusError as exc:
        return exc.status_code, _error(exc)


async def _wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the engine"
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------------------------------- 1. isolation


async def test_one_bad_request_fails_alone_among_valid_ones(live, served, monkeypatch):
    engine = served[0]
    client = live.client(max_retries=0)
    # Caller errors a batch used to choke on: refused before they reach the engine's batch.
    valid = [client.chat.completions.create(model="agent", messages=USER, max_tokens=24, seed=i) for i in range(3)]
    hostile = [client.chat.completions.create(model="agent", messages=USER, max_tokens=8, seed=2**70),
               client.completions.create(model="tiny", prompt=[1, 2, 10**7], max_tokens=4)]
    results = await asyncio.gather(*valid, *hostile, return_exceptions=True)
    assert all(isinstance(r, openai.types.chat.ChatCompletion) for r in results[:3]), results[:3]
    assert [(r.status_code, _error(r)["param"]) for r in results[3:]] == [(400, "seed"), (400, "prompt")]
    # A failure inside a batch (here a forward pass that breaks on one request's token): only that
    # request fails; the SDK does not retry it (x-should-retry: false), so it reached the engine once.
    real_forward = engine.runner.forward

    def forward(input_ids, *args, **kwargs):
        if bool((input_ids == 4242).any()):
            raise RuntimeError("a poisoned batch")
        return real_forward(input_ids, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "forward", forward)
    failed_before = engine.stats.failed_requests
    retrying = live.client()  # the SDK's default: 2 retries of a 5xx, unless told not to
    valid = [client.chat.completions.create(model="agent", messages=USER, max_tokens=24, seed=i) for i in range(3)]
    poisoned = retrying.completions.create(model="tiny", prompt=[1, 2, 4242], max_tokens=4)
    results = await asyncio.gather(*valid, poisoned, return_exceptions=True)
    assert all(isinstance(r, openai.types.chat.ChatCompletion) for r in results[:3]), results[:3]
    assert isinstance(results[3], openai.InternalServerError)
    assert "poisoned" not in str(results[3])  # the internal error text stays in the server log
    assert engine.stats.failed_requests - failed_before == 1


# ---------------------------------------------------------------------------------------- 2. caller errors


@pytest.mark.parametrize("body, param", [
    ({"response_format": "json"}, "response_format"),
    ({"stream": True, "stream_options": [1]}, "stream_options"),
    ({"tools": ["f"], "tool_choice": "required"}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"parameters": {"type": "object"}}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "a": {"type": "nonsense"}}}}}]}, "tools[0].function.parameters"),  # validated though not forced
    ({"messages": USER + [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]},
     "messages[1].tool_calls[0].function"),
    ({"seed": 2**70}, "seed"),
    ({"top_k": 2**63}, "top_k"),  # past int64: it once reached the sampler's tensor and failed as a 500
    ({"temperature": "hot"}, "temperature"),
    ({"n": 0}, "n"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [TOOL]}, "tool_choice"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0].type"),
    ({"tpo_k": 5}, "tpo_k"),  # a misspelt extra is named, not ignored
])
async def test_malformed_fields_are_400s_naming_the_field(live, body, param):
    payload = {"model": "agent", "messages": USER, "max_tokens": 4, **body}
    async with httpx.AsyncClient(base_url=live.url) as http:
        r = await http.post("/v1/chat/completions", json=payload)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert param.split("[")[0].split(".")[0] in error["message"]


async def test_text_that_is_not_utf8_is_a_400_that_says_so(live):
    # json.dumps writes a lone surrogate (a tool output decoded with surrogateescape) as an escape the
    # server's parser refuses; the message says what it is and what to do, not only the parser's words
    import json

    lone = json.dumps({"model": "agent", "messages": [{"role": "user", "content": "a \ud800 b"}], "max_tokens": 2})
    assert "\\ud800" in lone
    not_utf8 = b'{"model": "agent", "messages": [{"role": "user", "content": "\xff\xfe"}], "max_tokens": 2}'
    async with httpx.AsyncClient(base_url=live.url) as http:
        for body in (lone.encode(), not_utf8):
            r = await http.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
            assert "strings must be UTF-8 text: a lone surrogate escape" in r.json()["error"]["message"]


async def test_out_of_vocabulary_ids_and_unknown_extras_through_the_sdk(live):
    client = live.client(max_retries=0)
    status, error = await _status(client.completions.create(model="tiny", prompt=[5, -1], max_tokens=2))
    assert (status, error["param"]) == (400, "prompt") and "outside the vocabulary" in error["message"]
    status, error = await _status(client.chat.completions.create(model="agent", messages=USER, max_tokens=2,
                                                                 extra_body={"top_kk": 3}))
    assert (status, error["param"]) == (400, "top_kk") and "unknown field" in error["message"]


# ---------------------------------------------------------------------------------------- 3. a 500


async def test_a_server_bug_is_a_500_that_keeps_the_connection_and_is_not_retried(live, monkeypatch):
    import groupwise.inference.server as server

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(server, "chat_response", broken)
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=60)
    body = json.dumps({"model": "agent", "messages": USER, "max_tokens": 2})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"content-type": "application/json"})
    r = conn.getresponse()
    error = json.loads(r.read())["error"]
    assert r.status == 500 and error["type"] == "server_error" and "secret" not in error["message"]
    assert r.getheader("x-should-retry") == "false" and r.getheader("connection") != "close"
    local = conn.sock.getsockname()
    conn.request("GET", "/v1/models")  # the same keep-alive connection still serves
    r2 = conn.getresponse()
    assert r2.status == 200 and json.loads(r2.read())["data"]
    assert conn.sock.getsockname() == local  # not reconnected
    conn.close()
    calls.clear()
    with pytest.raises(openai.InternalServerError):
        await live.client().chat.completions.create(model="agent", messages=USER, max_tokens=2)
    assert len(calls) == 1  # the SDK (2 retries by default) sent it once


# ---------------------------------------------------------------------------------------- 4. bodies, tokenising


async def test_body_over_the_limit_is_413_and_the_server_serves_on(served):
    async with LiveServer(_app(served, max_body_bytes=65536)) as small:
        big = {"model": "agent", "messages": [{"role": "user", "content": "x" * 100_000}]}
        async with httpx.AsyncClient(base_url=small.url) as http:
            r = await http.post("/v1/chat/completions", json=big)
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

            async def chunks():  # no content-length: counted while read
                for _ in range(20):
                    yield b" " * 8192

            r = await http.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
            assert r.status_code == 413
            ok = await http.post("/v1/chat/completions", json={"model": "agent", "messages": USER, "max_tokens": 2})
            assert ok.status_code == 200


async def test_a_large_body_hands_its_heap_back_once_answered_at_most_once_a_second(served, monkeypatch):
    import groupwise.inference.memory_release as memory_release

    trims = []
    monkeypatch.setattr(memory_release, "release_freed_memory", lambda: trims.append(time.monotonic()) or True)
    async with LiveServer(_app(served)) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=60) as http:
            small = {"model": "agent", "messages": USER, "max_tokens": 2}
            assert (await http.post("/v1/chat/completions", json=small)).status_code == 200
            await asyncio.sleep(0.2)
            assert trims == []  # small requests cost nothing
            tools = [dict(TOOL, function=dict(TOOL["function"], name=f"f{i}")) for i in range(12_000)]
            big = dict(small, tools=tools)  # ~1.4 MB: refused (too many tools), parsed first
            assert len(json.dumps(big)) > 1 << 20
            assert (await http.post("/v1/chat/completions", json=big)).status_code == 400
            await _wait_for(lambda: len(trims) == 1)
            assert (await http.post("/v1/chat/completions", json=big)).status_code == 400
            await asyncio.sleep(0.3)
            assert len(trims) == 1  # within a second of the last trim: none
            await asyncio.sleep(1.0)
            assert (await http.post("/v1/chat/completions", json=big)).status_code == 400
            await _wait_for(lambda: len(trims) == 2)


def _app(served, **kwargs):
    from groupwise.inference.server import create_app

    return create_app(served[1], **kwargs)


async def test_a_prompt_that_cannot_fit_is_refused_before_tokenising(live, served, monkeypatch):
    tok = served[0].tokenizer
    calls = []
    real = tok.apply_chat_template
    monkeypatch.setattr(tok, "apply_chat_template", lambda *a, **k: calls.append(1) or real(*a, **k))
    longest = max(len(t) for t in tok.get_vocab())
    text = "y" * (served[0].context_length * longest + 1)  # more characters than any context can hold
    status, error = await _status(live.client(max_retries=0).chat.completions.create(
        model="agent", messages=[{"role": "user", "content": text}], max_tokens=2))
    assert status == 400 and error["code"] == "context_length_exceeded" and calls == []
    # the same text as a tool call's arguments is counted too (it was rendered first: 13 s for 7 MB)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": text}}
    status, error = await _status(live.client(max_retries=0).chat.completions.create(
        model="agent", max_tokens=2, messages=[*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                                               {"role": "tool", "tool_call_id": "c1", "content": "ok"}]))
    assert status == 400 and error["code"] == "context_length_exceeded" and calls == []


async def test_a_tiny_temperature_is_greedy_and_a_tiny_repetition_penalty_is_refused(live):
    # 1e-40 became 0 in float32: NaN probabilities sampled one fixed junk token with a 200
    client = live.client(max_retries=0)
    from groupwise.core.choices import choice_token_ids

    async def ids(**sampling) -> list[int]:
        r = await client.chat.completions.create(model="agent", messages=USER, max_tokens=8, seed=3, **sampling)
        return choice_token_ids(r.choices[0])

    greedy = await ids(temperature=0)
    assert await ids(temperature=1e-40) == greedy == await ids(temperature=5e-324)
    status, error = await _status(client.chat.completions.create(
        model="agent", messages=USER, max_tokens=2, extra_body={"repetition_penalty": 1e-40}))
    assert status == 400 and "repetition_penalty" in error["message"]


async def test_a_body_sent_as_a_form_or_text_is_a_415(live):
    # the types a web page may send cross-origin without a preflight: any page could make a loopback
    # server without a key generate
    body = json.dumps({"model": "agent", "messages": USER, "max_tokens": 2}).encode()
    async with httpx.AsyncClient(base_url=live.url) as http:
        for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            r = await http.post("/v1/chat/completions", content=body, headers={"content-type": media})
            assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type", media
        for headers in ({"content-type": "application/json; charset=utf-8"}, {}):
            r = await http.post("/v1/chat/completions", content=body, headers=headers)
            assert r.status_code == 200, (headers, r.text)


async def test_tokenising_runs_off_the_event_loop(live, served, monkeypatch):
    from groupwise.runtime.compute import compute_thread

    tok = served[0].tokenizer
    real = tok.apply_chat_template
    models_answered = threading.Event()
    threads = []

    def slow_template(messages, *args, **kwargs):
        if "slow" in str(messages):
            threads.append(threading.current_thread())
            assert models_answered.wait(30), "the event loop was blocked while tokenising"
        return real(messages, *args, **kwargs)

    monkeypatch.setattr(tok, "apply_chat_template", slow_template)
    client = live.client(max_retries=0)
    chat = asyncio.ensure_future(client.chat.completions.create(
        model="agent", messages=[{"role": "user", "content": "slow"}], max_tokens=2))
    await _wait_for(lambda: bool(threads))
    models = await client.models.list()  # answered while the prompt is being tokenised
    models_answered.set()
    assert models.data and (await chat).choices
    assert threads == [compute_thread()._thread]


# ---------------------------------------------------------------------------------------- 5. disconnects


async def test_a_client_that_goes_away_stops_its_generation(live, served):
    engine = served[0]
    body = json.dumps({"model": "agent", "messages": USER, "max_tokens": 1900, "ignore_eos": True}).encode()
    for stream in (False, True):
        payload = json.loads(body) | {"stream": stream}
        raw = json.dumps(payload).encode()
        cancelled, passes = engine.stats.cancelled_requests, engine.stats.decode_passes
        sock = socket.create_connection(("127.0.0.1", live.port))
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{live.port}\r\n".encode() + b"content-type: application/json\r\n"
                     + f"content-length: {len(raw)}\r\n\r\n".encode() + raw)
        if stream:
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # the stream is running
        await _wait_for(lambda: any(s.state.req.max_new_tokens == 1900 for s in engine.state.running))
        sock.close()
        await _wait_for(lambda: engine.stats.cancelled_requests == cancelled + 1 and not engine.state.running)
        assert engine.stats.decode_passes - passes < 1500  # far short of its 1900 tokens


# ---------------------------------------------------------------------------------------- 6. limits, routes, key


async def test_streaming_an_overlong_prompt_is_a_400_not_an_inband_error(live):
    status, error = await _status(live.client(max_retries=0).chat.completions.create(
        model="agent", messages=[{"role": "user", "content": "word " * 2100}], max_tokens=4, stream=True))
    assert status == 400 and error["code"] == "context_length_exceeded"


async def test_one_limit_for_n(live, served):
    limit = served[0].max_batch_size
    status, error = await _status(live.client(max_retries=0).chat.completions.create(
        model="agent", messages=USER, max_tokens=2, n=limit + 8))
    assert status == 400 and error["param"] == "n" and f"at most {limit}" in error["message"]
    r = await live.client().chat.completions.create(model="agent", messages=USER, max_tokens=2, n=limit)
    assert len(r.choices) == limit


async def test_model_routes_and_unknown_routes_answer_in_openai_shape(live):
    client = live.client(max_retries=0)
    assert (await client.models.retrieve("agent@1")).id == "agent@1"
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("nope")
    assert _error(info.value)["code"] == "model_not_found"
    async with httpx.AsyncClient(base_url=live.url) as http:
        for method, path, status in (("GET", "/v1/nothing", 404), ("POST", "/v2/chat", 404), ("DELETE", "/v1/models", 405)):
            r = await http.request(method, path)
            assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}


async def test_json_schema_numbers_are_bounded(live):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "x": {"type": "number"}},
              "required": ["n", "x"], "additionalProperties": False}
    from groupwise.inference.constrained import NUMBER_BOUND

    client = live.client(max_retries=0)
    for seed in range(2):
        r = await client.chat.completions.create(
            model="agent", messages=USER, max_tokens=100, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "nums", "schema": schema}})
        value = json.loads(r.choices[0].message.content)
        assert r.choices[0].finish_reason == "stop" and abs(value["n"]) <= NUMBER_BOUND
        assert abs(value["x"]) <= NUMBER_BOUND


async def test_the_key_guards_every_route_the_docs_too(served):
    async with LiveServer(_app(served, api_key="s3cret-key")) as keyed:
        async with httpx.AsyncClient(base_url=keyed.url) as http:
            for path in ("/v1/models", "/docs", "/openapi.json"):
                for auth in (None, "Bearer wrong", "Bearer s3cret", "Bearer s3cret-key-longer", "s3cret-key"):
                    headers = {"authorization": auth} if auth else {}
                    r = await http.get(path, headers=headers)
                    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, auth)
                r = await http.get(path, headers={"authorization": "Bearer s3cret-key"})
                assert r.status_code == 200, path
        r = await keyed.client(api_key="s3cret-key").chat.completions.create(model="tiny", messages=USER, max_tokens=2)
        assert r.usage.completion_tokens >= 1
        # vLLM's liveness probe answers without the key, and says nothing but whether the engine takes requests
        async with httpx.AsyncClient(base_url=keyed.url) as http:
            r = await http.get("/health")
            assert (r.status_code, r.content) == (200, b"")
            assert (await http.post("/health")).status_code == 405
    # an engine that was closed (its backend shutting down) is reported unhealthy
    from types import SimpleNamespace

    from groupwise.inference.server import create_app

    closed = SimpleNamespace(engine=SimpleNamespace(closed=True, tokenizer=served[0].tokenizer))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(closed)), base_url="http://x") as http:
        r = await http.get("/health")
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_closed"


# ---------------------------------------------------------------------------------------- sampling extras


async def _greedy_ids(client, **extra) -> list[int]:
    from groupwise.core.choices import choice_token_ids

    r = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=24, temperature=0,
                                             extra_body={"ignore_eos": True, **extra})
    return choice_token_ids(r.choices[0])


def _repeats(ids: list[int]) -> int:
    return len(ids) - len(set(ids))


async def test_sampling_extras_through_extra_body(live):
    from groupwise.core.choices import choice_token_ids

    client = live.client(max_retries=0)
    greedy = await _greedy_ids(client)
    assert _repeats(greedy) > 12  # the tiny random model loops when greedy
    # top_k=1 and min_p=1 leave only the most likely token: sampling at temperature 1 is greedy
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        r = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=24, seed=3,
                                                 extra_body={"ignore_eos": True, **extra})
        assert choice_token_ids(r.choices[0]) == greedy, extra
    free = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=24, seed=3,
                                                extra_body={"ignore_eos": True})
    assert choice_token_ids(free.choices[0]) != greedy  # (so the two above did something)
    # penalties break the loop; frequency grows per repeat, so at 0.5 it repeats less than presence
    assert _repeats(await _greedy_ids(client, repetition_penalty=100.0)) == 0
    assert _repeats(await _greedy_ids(client, presence_penalty=2.0)) == 0
    assert _repeats(await _greedy_ids(client, frequency_penalty=2.0)) == 0
    assert _repeats(await _greedy_ids(client, frequency_penalty=0.5)) < _repeats(
        await _greedy_ids(client, presence_penalty=0.5)) < _repeats(greedy)
    # stop and seed through extra_body too (as a vLLM client sends them)
    seeded = [choice_token_ids((await client.chat.completions.create(
        model="agent@0", messages=USER, max_tokens=8, extra_body={"seed": 11})).choices[0]) for _ in range(2)]
    assert seeded[0] == seeded[1]
    text = (await client.chat.completions.create(model="agent@1", messages=USER, max_tokens=16, seed=11)).choices[0].message.content
    cut = await client.chat.completions.create(model="agent@1", messages=USER, max_tokens=16, seed=11,
                                               extra_body={"stop": [text[4:7]]})
    assert cut.choices[0].message.content == text[: text.find(text[4:7])]
    for bad in ({"top_k": -5}, {"min_p": 2.0}, {"repetition_penalty": 0}, {"presence_penalty": 9}):
        status, error = await _status(client.chat.completions.create(model="agent", messages=USER, max_tokens=2,
                                                                     extra_body=bad))
        assert (status, error["param"]) == (400, next(iter(bad))), bad


async def test_chat_template_kwargs_reach_the_template(live, served, monkeypatch):
    """vLLM's `chat_template_kwargs` (ART's Qwen3 programs send `enable_thinking: False`) are the chat
    template's variables; the arguments that shape the rendering (the generation prompt) stay ours."""
    tokenizer = served[0].state.tokenizer
    monkeypatch.setattr(tokenizer, "chat_template", (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"))
    client = live.client(max_retries=0)

    async def prompt_tokens(**extra) -> int:
        r = await client.chat.completions.create(model="agent", messages=USER, max_tokens=1, extra_body=extra)
        return r.usage.prompt_tokens

    plain = await prompt_tokens()
    assert await prompt_tokens(chat_template_kwargs={"enable_thinking": True}) == plain
    assert await prompt_tokens(chat_template_kwargs={"enable_thinking": False}) > plain
    assert await prompt_tokens(chat_template_kwargs={"add_generation_prompt": False, "unused": 1}) == plain
    status, error = await _status(client.chat.completions.create(
        model="agent", messages=USER, max_tokens=1, extra_body={"chat_template_kwargs": ["enable_thinking"]}))
    assert (status, error["param"]) == (400, "chat_template_kwargs")
    # the tokenizer's own arguments are not template variables: a request's own Jinja template would run on
    # the engine's thread (a loop of 12,000 x 12,000 held every caller for 12 s), truncation or padding
    # would sample from a prompt other than the one the trainer renders
    for hostile in ({"chat_template": "{% for i in range(99999) %}{% endfor %}x"}, {"truncation": True, "max_length": 1},
                    {"padding": "max_length", "max_length": 2000}, {"return_tensors": "pt"}, {"messages": []},
                    {"tokenizer_kwargs": {"add_special_tokens": True}}):
        status, error = await _status(client.chat.completions.create(
            model="agent", messages=USER, max_tokens=1, extra_body={"chat_template_kwargs": hostile}))
        assert (status, error["param"]) == (400, "chat_template_kwargs"), hostile
        assert "only hold the chat template's own variables" in error["message"]
    assert await prompt_tokens() == plain


# ------------------------------------------------------------------------------- 3. every field, hostile

HOSTILE = [None, -1, 0, 2**63, -(2**63) - 1, 1e308, "", "x" * 5000, "\ud800", "\x00", [], [None], {}, {"a": [1]}, True,
           [[[]]], ["a"] * 50, {"type": "json_object"}, "required"]
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed",
               "logprobs", "top_logprobs", "stream", "stream_options", "tools", "tool_choice", "response_format",
               "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty", "ignore_eos",
               "stop_token_ids", "chat_template_kwargs", "guided_choice", "guided_json", "return_tokens_as_token_ids"]
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "echo", "logprobs", "n", "stop", "stream", "seed", "top_k"]


async def test_every_field_set_to_a_hostile_value_is_never_a_server_error(live):
    """Each field of a valid request replaced by each hostile value (wrong types, int64 edges, lone
    surrogates, huge strings): the answer is a 200 or a 4xx, never a 5xx or a hang, and the server serves
    a plain request after every batch. (A top_k past int64 once reached the sampler's tensor: a 500.)"""
    chat = {"model": "agent", "messages": USER, "max_tokens": 3}
    completion = {"model": "agent", "prompt": "Hello", "max_tokens": 3}
    cases = [("/v1/chat/completions", {**chat, f: v}) for f in CHAT_FIELDS for v in HOSTILE]
    cases += [("/v1/completions", {**completion, f: v}) for f in COMPLETION_FIELDS for v in HOSTILE]
    cases += [("/v1/completions", {**completion, "prompt": [5, v]}) for v in (2**63, -1, 10**9)]
    # A limit of 2**63 tokens is served (a 200) by decoding to the end of the context, ~2,000 tokens on the
    # tiny model: those requests go in one batch, where they decode side by side rather than each holding
    # up a batch of its own. Every case is still sent, and a plain request still follows every batch.
    def to_the_context_end(case: tuple[str, dict]) -> bool:
        return any(case[1].get(field) == 2**63 for field in ("max_tokens", "max_completion_tokens"))

    cases = [case for case in cases if to_the_context_end(case)] + [case for case in cases
                                                                     if not to_the_context_end(case)]
    server_errors = []
    async with httpx.AsyncClient(base_url=live.url, timeout=60) as http:
        async def send(path: str, payload: dict) -> int:
            body = json.dumps(payload).encode("utf-8", "surrogatepass")  # a lone surrogate, as a client may send it
            r = await asyncio.wait_for(http.post(path, content=body, headers={"content-type": "application/json"}), 60)
            if r.status_code >= 500:
                server_errors.append((path, payload, r.status_code, r.text[:200]))
            return r.status_code

        for i in range(0, len(cases), 16):
            await asyncio.gather(*(send(p, c) for p, c in cases[i:i + 16]))
            assert await send("/v1/chat/completions", chat) == 200, cases[i:i + 16]
    assert not server_errors, server_errors[:5]


async def test_a_grammar_out_of_fuel_ends_its_choice_and_says_so_in_the_log(live, caplog, capfd):
    # a 2M-character const: the grammar compiles, then a step's mask runs past llguidance's fuel. The
    # choice ends ('stop', docs/security.md), the engine's log says why, and nothing is printed.
    schema = {"type": "object", "properties": {"a": {"const": "x" * 2_000_000}}, "required": ["a"]}
    with caplog.at_level("WARNING", logger="groupwise.inference.advance"):
        r = await live.client().chat.completions.create(
            model="agent", messages=USER, max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and len(choice.message.content) < 100
    assert any("ended before its grammar was complete" in rec.getMessage() and "too many" in rec.getMessage()
               for rec in caplog.records)
    assert "too many" not in capfd.readouterr().out
    ok = await live.client().chat.completions.create(model="agent", messages=USER, max_tokens=3)
    assert ok.choices[0].finish_reason in ("stop", "length")
