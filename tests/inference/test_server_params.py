"""No parameter gives a 500 from the inference server: hypothesis sends every route hostile values in
every field it reads (text holding NUL and lone surrogates, huge, negative and 5,000-digit numbers,
other JSON types, unknown and malformed model names, streamed or not) through the transport the
rollouts use. Every answer is 200, or a 4xx whose OpenAI error names the parameter."""

from __future__ import annotations

import json
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groupwise.runtime.loading import tiny_random_model

EXAMPLES = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
HUGE = ["9" * 5000, "-" + "9" * 5000, "1e999", "-1e999", "1" + "0" * 400 + ".5", str(2**63), str(-2**63 - 1),
        str(2**64), "1e-400", "-0", "0.0"]

hostile_text = st.text(max_size=30) | st.sampled_from(
    ["\x00", "agent\x00", "\ud800", "agent@\udfff", "agent@" + "9" * 5000, "agent@-1", "agent@²", "agent@1.5",
     "agent@", "@", "tiny@0", "agent@2", "a" * 300, "../agent", "agent\n", " agent", "\u2028"])
raw_number = st.sampled_from(HUGE)  # written into the body as is: JSON numbers Python would not print
numbers = st.integers() | st.integers(-10**30, 10**30) | st.floats(allow_nan=False) | st.just(0) | st.integers(1, 3)
json_other = st.none() | st.booleans() | st.lists(st.integers(0, 5), max_size=3) | st.dictionaries(
    st.text(max_size=3), st.integers(), max_size=2)
anything = hostile_text | numbers | json_other | raw_number.map(lambda s: ("RAW", s))

SAMPLING = ["n", "max_tokens", "temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty",
            "top_k", "min_p", "repetition_penalty", "stop_token_ids", "ignore_eos", "stream", "user",
            "return_tokens_as_token_ids", "logprobs"]
CHAT = SAMPLING + ["top_logprobs", "max_completion_tokens", "tool_choice", "metadata", "parallel_tool_calls",
                   "reasoning_effort", "chat_template_kwargs", "guided_choice"]
COMPLETION = SAMPLING + ["echo", "suffix", "best_of"]


def body_bytes(body: dict) -> bytes:
    """JSON with ("RAW", digits) values written as the digits themselves (5,000-digit numbers)."""
    raws: dict[str, str] = {}

    def mark(v):
        if isinstance(v, tuple) and v and v[0] == "RAW":
            key = f"@@raw{len(raws)}@@"
            raws[key] = v[1]
            return key
        if isinstance(v, dict):
            return {k: mark(x) for k, x in v.items()}
        if isinstance(v, list):
            return [mark(x) for x in v]
        return v

    text = json.dumps(mark(body), ensure_ascii=True)  # a lone surrogate as \ud800, valid JSON
    for key, raw in raws.items():
        text = text.replace(json.dumps(key), raw)
    return text.encode()


@pytest.fixture(scope="module")
def small_app():
    """A tiny model with a 96-token context (a huge max_tokens is clamped to little work), 'agent' at step 0."""
    from groupwise.inference.engine import Engine
    from groupwise.inference.registry import ModelRegistry
    from groupwise.inference.server import create_app

    model, tok = tiny_random_model(seed=0, max_position_embeddings=96)
    engine = Engine(model, tok, max_batch_size=4, max_new_tokens_default=4)
    registry = ModelRegistry(engine, base_name="tiny")
    registry.register_model("agent")
    yield create_app(registry)
    engine.close()


async def send(app, method: str, path: str, body: bytes | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://groupwise.local", timeout=120) as client:
        return await client.request(method, path, content=body,
                                    headers={"content-type": "application/json"} if body is not None else None)


def check(r: httpx.Response, sent: set[str]) -> None:
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:400])
    if r.status_code != 200:
        error = r.json()["error"]
        param = error.get("param")
        root = (param or "").split(".")[0].split("[")[0]
        assert root in sent or (param is None and error["code"] in ("unknown_url",)), (sent, r.status_code, error)


@EXAMPLES
@given(fields=st.dictionaries(st.sampled_from(CHAT), anything, max_size=4), model=hostile_text | st.just("agent"),
       content=hostile_text, role=st.sampled_from(["user", "system", "assistant"]) | hostile_text)
async def test_chat_answers_any_parameter(small_app, fields, model, content, role):
    body = {"model": model, "messages": [{"role": role, "content": content}], "max_tokens": 2, **fields}
    r = await send(small_app, "POST", "/v1/chat/completions", body_bytes(body))
    check(r, {"model", "messages", "max_tokens", *fields})


@EXAMPLES
@given(fields=st.dictionaries(st.sampled_from(COMPLETION), anything, max_size=4), model=hostile_text | st.just("agent"),
       prompt=hostile_text | st.lists(st.integers(-5, 10**12), max_size=4))
async def test_completions_answer_any_parameter(small_app, fields, model, prompt):
    body = {"model": model, "prompt": prompt, "max_tokens": 2, **fields}
    r = await send(small_app, "POST", "/v1/completions", body_bytes(body))
    check(r, {"model", "prompt", "max_tokens", *fields})


@EXAMPLES
@given(model_id=hostile_text)
async def test_a_model_card_answers_any_name(small_app, model_id):
    r = await send(small_app, "GET", "/v1/models/" + quote(model_id.encode("utf-8", "surrogatepass"), safe=""))
    assert r.status_code in (200, 404), (model_id, r.status_code, r.text[:300])
    if r.status_code == 404:
        assert r.json()["error"]["param"] == "model" or r.json()["error"]["code"] == "unknown_url"


@EXAMPLES
@given(path=hostile_text, method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
async def test_any_path_and_method_is_answered_without_a_500(small_app, path, method):
    r = await send(small_app, method, "/" + quote(path.encode("utf-8", "surrogatepass"), safe="/"),
                   b"{}" if method in ("POST", "PUT", "PATCH") else None)
    assert r.status_code < 500, (method, path, r.status_code, r.text[:300])
