"""Integration: the real `openai` client against the real app (in-process ASGI transport)."""

from __future__ import annotations

import asyncio
import json
import re

import openai
import pytest
import torch

from groupwise.core.choices import choice_logprobs, choice_token_ids, choice_token_texts

USER = [{"role": "user", "content": "Say something."}]


def prompt_ids(tok, messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]


def reference_logprobs(model, prompt, sampled):
    """The model's own log-softmax at the sampled tokens, from one plain forward pass."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), dim=-1)[0]  # [T, V]
    return logp[len(prompt) - 1 : -1].gather(1, torch.tensor(sampled)[:, None])[:, 0].tolist()


async def test_chat_returns_step_token_ids_and_logprobs(client, tiny):
    model, tok = tiny
    r = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=12, seed=7)
    choice = r.choices[0]
    assert r.model == "agent@0" and r.system_fingerprint == "agent@0"
    ids, lps = choice_token_ids(choice), choice_logprobs(choice)
    assert ids and len(ids) == len(lps) == r.usage.completion_tokens
    assert choice.message.content == tok.decode(ids, skip_special_tokens=True)
    # agent@0 is the base model: its logprobs must equal the tiny model's own log-softmax (CPU fp32).
    ref = reference_logprobs(model, prompt_ids(tok, USER), ids)
    assert max(abs(a - b) for a, b in zip(lps, ref)) < 1e-3


async def test_latest_step_and_adapter_logprobs(client, adapter_dirs, tiny):
    from peft import PeftModel

    from groupwise.runtime.loading import tiny_random_model

    r = await client.chat.completions.create(model="agent", messages=USER, max_tokens=10, seed=1)
    assert r.model == "agent@2"  # plain name = latest step
    base, _ = tiny_random_model(seed=0, tokenizer=tiny[1])
    ref_model = PeftModel.from_pretrained(base, adapter_dirs[2]).eval()
    ids = choice_token_ids(r.choices[0])
    ref = reference_logprobs(ref_model, prompt_ids(tiny[1], USER), ids)
    assert max(abs(a - b) for a, b in zip(choice_logprobs(r.choices[0]), ref)) < 1e-3


async def test_two_adapters_at_once_give_their_own_outputs(client, served):
    # Greedy, concurrently, in one running batch: each step answers like itself alone.
    names = ["agent@0", "agent@1", "agent@2"]
    together = await asyncio.gather(*[
        client.chat.completions.create(model=m, messages=USER, max_tokens=12, temperature=0) for m in names])
    alone = [await client.chat.completions.create(model=m, messages=USER, max_tokens=12, temperature=0)
             for m in names]
    ids_together = [choice_token_ids(r.choices[0]) for r in together]
    assert ids_together == [choice_token_ids(r.choices[0]) for r in alone]
    assert [r.model for r in together] == names
    assert len({tuple(i) for i in ids_together}) == 3  # the three policies differ


async def test_n_and_seed(client):
    r = await client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, n=3, seed=5)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({tuple(choice_token_ids(c)) for c in r.choices}) == 3  # choice i uses seed 5 + i
    again = await client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, n=3, seed=5)
    assert [choice_token_ids(c) for c in again.choices] == [choice_token_ids(c) for c in r.choices]


async def test_stop_sequence(client, tiny):
    tok = tiny[1]
    kwargs = dict(model="agent@1", messages=USER, max_tokens=16, seed=11)
    free = await client.chat.completions.create(**kwargs)
    text = free.choices[0].message.content
    words = re.findall(r"[A-Za-z]{3,}", text[3:])
    assert words, text
    stop = words[len(words) // 2][:3]
    r = await client.chat.completions.create(**kwargs, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.find(stop)]
    # token ids run up to (and include) the token that completed the stop string
    assert stop in tok.decode(choice_token_ids(r.choices[0]), skip_special_tokens=True)


async def test_tool_call_round_trip(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                       "required": ["city"]}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    r = await client.chat.completions.create(model="agent", messages=messages, tools=tools, max_tokens=40,
                                             tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}]
    final = await client.chat.completions.create(model="agent", messages=messages, tools=tools, max_tokens=8)
    assert final.choices[0].message.content  # a final (random-model) answer, no crash
    required = await client.chat.completions.create(model="agent", messages=messages[:1], tools=tools,
                                                    tool_choice="required", max_tokens=40)
    assert required.choices[0].message.tool_calls[0].function.name == "get_weather"


async def test_streaming_matches_plain(client):
    kwargs = dict(model="agent@1", messages=USER, max_tokens=10, temperature=0)
    plain = await client.chat.completions.create(**kwargs)
    stream = await client.chat.completions.create(**kwargs, stream=True)
    text, ids, finish = "", [], None
    async for chunk in stream:
        c = chunk.choices[0]
        text += c.delta.content or ""
        ids += (c.model_extra or {}).get("token_ids") or []
        finish = c.finish_reason or finish
        assert chunk.model == "agent@1"
    assert text == plain.choices[0].message.content
    assert ids == choice_token_ids(plain.choices[0])
    assert finish == plain.choices[0].finish_reason


async def test_completions_endpoint(client):
    r = await client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=0)
    c = r.choices[0]
    assert len(c.logprobs.token_logprobs) == len(c.model_extra["token_ids"]) == r.usage.completion_tokens
    assert r.model == "tiny"


async def test_bad_requests_get_4xx_then_service_continues(client, served):
    cases = [
        (dict(model="nope", messages=USER), 404, "agent@2"),  # message lists what is served
        (dict(model="agent@9", messages=USER), 404, "[0, 1, 2]"),
        (dict(model="agent", messages=[]), 400, "messages"),
        (dict(model="agent", messages=USER, max_tokens=-1), 400, "max_tokens"),
        (dict(model="agent", messages=[{"role": "user", "content": "word " * 2100}]), 400, "context length"),
        (dict(model="agent", messages=USER, response_format={"type": "xml"}), 400, "response_format"),
    ]
    for kwargs, status, needle in cases:
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(**kwargs)
        assert info.value.status_code == status, kwargs
        assert needle in info.value.body["message"]
        assert set(info.value.body) == {"message", "type", "param", "code"}
    from groupwise.inference.client import in_process_http_client

    async with in_process_http_client(served[2]) as http:  # raw HTTP: the SDK cannot send broken JSON
        raw = await http.post("/chat/completions", content=b"{not json")
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    ok = await client.chat.completions.create(model="agent", messages=USER, max_tokens=3)
    assert ok.choices[0].message.content is not None


async def test_models_list(client):
    ids = [m.id for m in (await client.models.list()).data]
    assert ids == ["tiny", "agent", "agent@0", "agent@1", "agent@2"]


async def test_18_concurrent_requests_share_forward_passes(client, served):
    engine = served[0]
    before = engine.stats.forward_passes
    results = await asyncio.gather(*[
        client.chat.completions.create(model="agent", messages=[{"role": "user", "content": f"Rollout {i}"}],
                                       max_tokens=16, seed=i) for i in range(18)])
    used = engine.stats.forward_passes - before
    # One request alone needs one pass per generated token (prefill yields the first token).
    sequential = sum(r.usage.completion_tokens for r in results)
    assert used < sequential / 4, (used, sequential)


async def test_api_key_is_enforced(served):
    from groupwise.inference.client import in_process_client
    from groupwise.inference.server import create_app

    app = create_app(served[1], api_key="s3cret")
    with pytest.raises(openai.AuthenticationError):
        await in_process_client(app, api_key="wrong").models.list()
    r = await in_process_client(app, api_key="s3cret").chat.completions.create(model="tiny", messages=USER, max_tokens=2)
    assert r.usage.completion_tokens >= 1


async def test_streaming_with_stop_and_n_matches_plain(client):
    kwargs = dict(model="agent@1", messages=USER, max_tokens=16, seed=11, n=2)
    free = await client.chat.completions.create(**kwargs)
    words = re.findall(r"[A-Za-z]{3,}", free.choices[0].message.content[3:])
    kwargs["stop"] = [words[len(words) // 2][:3]]
    plain = await client.chat.completions.create(**kwargs)
    texts, finishes = ["", ""], [None, None]
    async for chunk in await client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes[c.index]
    assert texts == [c.message.content for c in plain.choices]  # the stop string never leaks out
    assert finishes == [c.finish_reason for c in plain.choices] and finishes[0] == "stop"


async def test_tokens_as_token_ids_by_default_as_arts_vllm_and_text_on_request(client, tiny):
    """Each logprob entry names its token "token_id:<id>" unless the request turns vLLM's
    `return_tokens_as_token_ids` off: a client layer that keeps logprobs but drops the `token_ids` field
    (LiteLLM 1.65) still hands the trainer the sampled ids."""
    _, tok = tiny
    kwargs = dict(model="agent@0", messages=USER, max_tokens=8, seed=3, top_logprobs=2)
    by_id = (await client.chat.completions.create(**kwargs)).choices[0]
    ids = by_id.model_extra["token_ids"]
    assert [e.token for e in by_id.logprobs.content] == [f"token_id:{i}" for i in ids]
    assert all(t.token.startswith("token_id:") for e in by_id.logprobs.content for t in e.top_logprobs)
    # the text stays in each entry's bytes
    assert [bytes(e.bytes).decode() for e in by_id.logprobs.content] == [tok.decode([i]) for i in ids]
    # the ids are recovered from the logprobs alone, as after LiteLLM's conversion
    without_field = by_id.model_copy()
    without_field.__pydantic_extra__ = {}
    assert choice_token_ids(without_field) == ids
    as_text = (await client.chat.completions.create(
        **kwargs, extra_body={"return_tokens_as_token_ids": False})).choices[0]
    assert as_text.model_extra["token_ids"] == ids  # the same seed samples the same tokens
    assert [e.token for e in as_text.logprobs.content] == [tok.decode([i]) for i in ids]
    assert choice_token_ids(as_text) == ids
    done = await client.completions.create(model="tiny", prompt="Once", max_tokens=4, temperature=0)
    assert done.choices[0].logprobs.tokens == [f"token_id:{i}" for i in done.choices[0].model_extra["token_ids"]]


async def test_guided_choice_answers_one_of_the_texts_exactly(client, tiny):
    """vLLM's `guided_choice` (ART's teacher guidance): the answer is one of the texts, then it ends;
    where only one text remains possible its tokens are forced. OpenAI's `reasoning_effort` is accepted."""
    _, tok = tiny
    moves = ["<move>A1</move>", "<move>B2</move>", 'say "C3"\n']
    for seed in range(6):
        r = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=40, seed=seed,
                                                 reasoning_effort="low", extra_body={"guided_choice": moves})
        choice = r.choices[0]
        assert choice.message.content in moves and choice.finish_reason == "stop"
        ids = choice_token_ids(choice)
        assert tok.decode(ids, skip_special_tokens=True) == choice.message.content
        assert choice.model_extra["forced_token_indices"]  # past the first tokens, one text is left
    only = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=40,
                                                extra_body={"guided_choice": [moves[2]]})
    assert only.choices[0].message.content == moves[2]
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="agent@0", messages=USER, response_format={"type": "json_object"},
                                             extra_body={"guided_choice": moves})
    assert "one constraint" in info.value.body["message"]


async def test_guided_json_answers_in_the_schema(client):
    """vLLM's `guided_json` (a schema, or its JSON text), which programs of ART's vLLM days send in
    extra_body: the answer is JSON of the schema, as with response_format json_schema (whose name a
    schema's error gives)."""
    schema = {"type": "object", "properties": {"square": {"enum": ["A1", "B2", "C3"]}}, "required": ["square"]}
    for guided in (schema, json.dumps(schema)):
        r = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=40, seed=1,
                                                 extra_body={"guided_json": guided})
        assert json.loads(r.choices[0].message.content)["square"] in ("A1", "B2", "C3")
    for bad, says in ((["not", "a", "schema"], "must be a JSON schema"), ("{oops", "not JSON"),
                      ({"type": "nope"}, "not a valid JSON schema")):
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="agent@0", messages=USER, extra_body={"guided_json": bad})
        assert says in info.value.body["message"], info.value.body
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="agent@0", messages=USER, response_format={"type": "json_object"},
                                             extra_body={"guided_json": schema})
    assert "one constraint" in info.value.body["message"]


async def test_groupwise_clients_get_logprobs_as_one_list_unless_they_ask(client):
    """`TOKEN_DATA_HEADER`: the same seeded request, from a plain client and from groupwise's (the header),
    samples the same tokens; groupwise's gets ``logprobs`` null and the same logprobs as one list, which
    `choice_logprobs` reads; asking for logprobs gives the entries to either client."""
    from groupwise.core.choices import TOKEN_DATA_HEADER

    ours = client.with_options(default_headers={TOKEN_DATA_HEADER: "compact"})
    args = dict(model="agent@1", messages=USER, max_tokens=12, seed=11)
    plain, compact, asked = await asyncio.gather(client.chat.completions.create(**args),
                                                 ours.chat.completions.create(**args),
                                                 ours.chat.completions.create(**args, logprobs=True))
    full = plain.choices[0]
    assert full.logprobs is not None and len(full.logprobs.content) == len(choice_token_ids(full))
    # the same tokens; their logprobs equal up to rounding (requests batched differently compute them in
    # other shapes; test_responses.py pins that both forms carry the engine's floats bit for bit)
    c = compact.choices[0]
    assert c.logprobs is None and c.model_extra["token_logprobs"] == pytest.approx(choice_logprobs(full), abs=1e-4)
    assert choice_token_ids(c) == choice_token_ids(full) and choice_logprobs(c) == c.model_extra["token_logprobs"]
    assert choice_token_texts(c) == choice_token_texts(full) and "".join(choice_token_texts(c)).startswith(
        c.message.content)
    assert c.message.content == full.message.content
    a = asked.choices[0]
    assert [e.logprob for e in a.logprobs.content] == pytest.approx(choice_logprobs(full), abs=1e-4)
    assert choice_token_ids(a) == choice_token_ids(full) and "token_logprobs" not in a.model_extra
