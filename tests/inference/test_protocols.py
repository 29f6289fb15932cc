"""OpenAI's Responses API and Anthropic's Messages API on the server, through the real SDKs over HTTP."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from groupwise.core.choices import choice_logprobs, choice_token_ids
from groupwise.chat.protocols import chat_messages, choice_from_answer

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}
RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "weather", "parameters": WEATHER}]
MESSAGES_TOOLS = [{"name": "get_weather", "description": "weather", "input_schema": WEATHER}]


def _anthropic(live, **kwargs) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=live.url, api_key="unused", max_retries=0, **kwargs)


def _assert_token_data(choice, n_out: int | None = None) -> None:
    ids, lps = choice_token_ids(choice), choice_logprobs(choice)
    assert ids and lps and len(ids) == len(lps) and all(lp <= 0 for lp in lps)
    if n_out is not None:
        assert len(ids) == n_out


async def test_responses_plain_and_streamed_give_the_chat_answer(live):
    client = live.client(max_retries=0)
    chat = await client.chat.completions.create(model="agent@1", messages=[{"role": "system", "content": "be brief"},
                                                                            {"role": "user", "content": "hi"}],
                                                max_tokens=6, temperature=0.0)
    r = await client.responses.create(model="agent@1", instructions="be brief", input="hi", max_output_tokens=6,
                                      temperature=0.0)
    assert r.model == "agent@1" and r.status == "incomplete"  # 6 tokens, no EOS in a random model
    assert r.output_text == chat.choices[0].message.content
    choice = choice_from_answer(r)
    assert choice_token_ids(choice) == chat.choices[0].token_ids
    assert choice_logprobs(choice) == pytest.approx([e.logprob for e in chat.choices[0].logprobs.content])
    assert r.usage.output_tokens == 6 and r.usage.input_tokens == chat.usage.prompt_tokens
    async with client.responses.stream(model="agent@1", instructions="be brief", input="hi", max_output_tokens=6,
                                       temperature=0.0) as stream:
        events = [event async for event in stream]
    kinds = [e.type for e in events]
    # cut at max_output_tokens: OpenAI's stream ends with response.incomplete (not .completed), which holds it
    assert "response.output_text.delta" in kinds and kinds[-1] == "response.incomplete"
    final = events[-1].response
    assert final.output_text == r.output_text
    assert choice_token_ids(choice_from_answer(final)) == choice_token_ids(choice)


async def test_responses_tool_call_round_trip(live):
    client = live.client(max_retries=0)
    items: list = [{"role": "user", "content": "weather in Paris?"}]
    r = await client.responses.create(model="agent", input=items, tools=RESPONSES_TOOLS, max_output_tokens=40,
                                      tool_choice={"type": "function", "name": "get_weather"})
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and "city" in json.loads(calls[0].arguments)
    choice = choice_from_answer(r)
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].id == calls[0].call_id
    _assert_token_data(choice)
    items += [o.model_dump(exclude_none=True) for o in r.output]
    items.append({"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temp_c": 21}'})
    final = await client.responses.create(model="agent", input=items, tools=RESPONSES_TOOLS, max_output_tokens=5)
    assert final.output[0].type == "message"
    # the trajectory's prompt: the chat messages the server rendered (the call, then its result)
    messages = chat_messages({"input": items})
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == messages[2]["tool_call_id"] == calls[0].call_id
    # a streamed call arrives as one function_call item with its arguments
    async with client.responses.stream(model="agent", input=items[:1], tools=RESPONSES_TOOLS, max_output_tokens=40,
                                       tool_choice={"type": "function", "name": "get_weather"}) as stream:
        done = await stream.get_final_response()
    assert done.output[0].type == "function_call" and "city" in json.loads(done.output[0].arguments)


async def test_messages_plain_and_streamed_give_the_chat_answer(live):
    client = live.client(max_retries=0)
    chat = await client.chat.completions.create(model="agent@2", messages=[{"role": "system", "content": "be brief"},
                                                                            {"role": "user", "content": "hi"}],
                                                max_tokens=6, temperature=0.0)
    claude = _anthropic(live)
    # anthropic 2.x sends no temperature of its own (Claude's newer models take none); extra_body carries it
    m = await claude.messages.create(model="agent@2", system="be brief", max_tokens=6, extra_body={"temperature": 0.0},
                                     messages=[{"role": "user", "content": "hi"}])
    assert m.model == "agent@2" and m.stop_reason == "max_tokens" and m.usage.output_tokens == 6
    assert m.content[0].type == "text" and m.content[0].text == chat.choices[0].message.content
    choice = choice_from_answer(m)
    assert choice_token_ids(choice) == chat.choices[0].token_ids
    _assert_token_data(choice, 6)
    async with claude.messages.stream(model="agent@2", system=[{"type": "text", "text": "be brief"}], max_tokens=6,
                                      extra_body={"temperature": 0.0}, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert choice_token_ids(choice_from_answer(final)) == choice_token_ids(choice)
    await claude.close()


async def test_messages_tool_use_round_trip(live):
    claude = _anthropic(live)
    turns: list = [{"role": "user", "content": "weather in Paris?"}]
    m = await claude.messages.create(model="agent", max_tokens=40, messages=turns, tools=MESSAGES_TOOLS,
                                     tool_choice={"type": "tool", "name": "get_weather"})
    assert m.stop_reason == "tool_use"
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert use.name == "get_weather" and "city" in use.input
    _assert_token_data(choice_from_answer(m))
    turns += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 C"},
                                           {"type": "text", "text": "and so?"}]}]
    final = await claude.messages.create(model="agent", max_tokens=5, messages=turns, tools=MESSAGES_TOOLS)
    assert final.content and final.content[0].type == "text"
    messages = chat_messages({"system": "s", "messages": turns})
    assert [m_["role"] for m_ in messages] == ["system", "user", "assistant", "tool", "user"]
    async with claude.messages.stream(model="agent", max_tokens=40, messages=turns[:1], tools=MESSAGES_TOOLS,
                                      tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        streamed = await stream.get_final_message()
    assert streamed.content[-1].type == "tool_use" and "city" in streamed.content[-1].input
    await claude.close()


async def test_adapters_are_addressed_by_name(live):
    client, claude = live.client(max_retries=0), _anthropic(live)
    outs = {}
    for name in ("agent@1", "agent@2", "tiny"):
        r = await client.responses.create(model=name, input="hello", max_output_tokens=8, temperature=0.0)
        m = await claude.messages.create(model=name, max_tokens=8, extra_body={"temperature": 0.0},
                                         messages=[{"role": "user", "content": "hello"}])
        assert r.model == m.model == (name if name != "tiny" else r.model)
        assert choice_token_ids(choice_from_answer(r)) == choice_token_ids(choice_from_answer(m))
        outs[name] = choice_token_ids(choice_from_answer(r))
    assert outs["agent@1"] != outs["agent@2"]  # each request ran its own adapter
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="nobody", input="x")
    with pytest.raises(anthropic.NotFoundError) as caught:
        await claude.messages.create(model="nobody", max_tokens=3, messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "not_found_error"
    await claude.close()


async def test_a_bad_field_is_a_400_naming_it_in_each_apis_shape(live):
    client, claude = live.client(max_retries=0), _anthropic(live)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="agent", input="x", temperature=3.0)
    assert caught.value.body["param"] == "temperature" and "temperature" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="agent", input=[{"type": "function_call_output", "call_id": "c9",
                                                             "output": "1"}])
    assert caught.value.body["param"] == "input" and "c9" in caught.value.body["message"]
    with pytest.raises(openai.BadRequestError) as caught:
        await client.responses.create(model="agent", input="x", extra_body={"tempreture": 1})
    assert caught.value.body["param"] == "tempreture"
    with pytest.raises(anthropic.BadRequestError) as caught:
        await claude.messages.create(model="agent", max_tokens=0, messages=[{"role": "user", "content": "x"}])
    body = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("invalid request: max_tokens")
    with pytest.raises(anthropic.BadRequestError) as caught:
        await claude.messages.create(model="agent", max_tokens=3, messages=[
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}])
    assert "t1" in caught.value.body["error"]["message"]
    await claude.close()


async def test_the_host_guard_covers_the_new_routes(live):
    async with httpx.AsyncClient(base_url=live.url) as http:
        for path in ("/v1/responses", "/v1/messages"):
            r = await http.post(path, json={}, headers={"host": "attacker.example"})
            assert r.status_code == 403, (path, r.text)


async def test_anthropic_sdk_key_header_is_checked(served):
    """Anthropic's SDK sends its key as ``x-api-key``: accepted in place of ``Authorization: Bearer``."""
    from live_server import LiveServer

    from groupwise.inference.server import create_app

    async with LiveServer(create_app(served[1], api_key="sekret")) as server:
        claude = anthropic.AsyncAnthropic(base_url=server.url, api_key="sekret", max_retries=0)
        m = await claude.messages.create(model="agent", max_tokens=2, messages=[{"role": "user", "content": "x"}])
        assert m.usage.output_tokens == 2
        wrong = anthropic.AsyncAnthropic(base_url=server.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as caught:
            await wrong.messages.create(model="agent", max_tokens=2, messages=[{"role": "user", "content": "x"}])
        assert caught.value.body["error"]["type"] == "authentication_error"
        await claude.close()
        await wrong.close()


# ------------------------------------------------------------------------------ the translation, both ways

from hypothesis import given, settings, strategies as st  # noqa: E402

from groupwise.errors import InvalidDataError  # noqa: E402
from groupwise.chat.protocols import (ProtocolError, messages_answer, messages_to_chat, responses_answer,  # noqa: E402
                                 responses_to_chat)


def test_responses_items_become_chat_messages():
    chat = responses_to_chat({"model": "m", "instructions": "sys", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "r1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me look"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "function", "name": "f"}, "max_output_tokens": 7})
    assert chat["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "ab"},
        {"role": "assistant", "content": "let me look", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"}, {"role": "tool", "tool_call_id": "c2", "content": "two"}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "f"}} and chat["max_tokens"] == 7
    with pytest.raises(ProtocolError) as caught:
        responses_to_chat({"model": "m", "input": [{"type": "message", "role": "user",
                                                    "content": [{"type": "input_image", "image_url": "u"}]}]})
    assert caught.value.param == "input[0].content[0].type"
    with pytest.raises(ProtocolError) as caught:
        responses_to_chat({"model": "m", "input": "x", "previous_response_id": "resp_1"})
    assert caught.value.param == "previous_response_id"


def test_messages_blocks_become_chat_messages():
    chat = messages_to_chat({"model": "m", "max_tokens": 3, "system": [{"type": "text", "text": "sys"}], "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                          {"type": "text", "text": "calling"},
                                          {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "bad", "is_error": True},
                                     {"type": "text", "text": "go on"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"},
        "stop_sequences": ["END"]})
    assert chat["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "calling", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "Error: bad"}, {"role": "user", "content": "go on"}]
    assert chat["tool_choice"] == "required" and chat["stop"] == ["END"] and chat["max_tokens"] == 3
    with pytest.raises(ProtocolError) as caught:
        messages_to_chat({"model": "m", "max_tokens": 3, "messages": [
            {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})
    assert caught.value.param == "messages[0].content[0].type"


def test_an_answer_without_token_ids_is_refused():
    with pytest.raises(InvalidDataError, match="token_ids"):
        choice_from_answer({"type": "message", "content": [{"type": "text", "text": "hi"}]})


_names = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
_calls = st.lists(st.tuples(_names, st.dictionaries(_names, st.integers(), max_size=3)), max_size=3)


@settings(max_examples=50, deadline=None)
@given(text=st.one_of(st.none(), st.text(min_size=1, max_size=20)), calls=_calls,
       finish=st.sampled_from(["stop", "length"]), ids=st.lists(st.integers(0, 50000), min_size=1, max_size=10))
def test_a_chat_answer_survives_both_apis(text, calls, finish, ids):
    """chat answer -> Responses / Messages answer -> Choice: the text, the calls and the token data kept."""
    tool_calls = [{"id": f"call_{k}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                  for k, (n, a) in enumerate(calls)]
    finish = "tool_calls" if tool_calls and finish == "stop" else finish
    message = {"role": "assistant", "content": text, **({"tool_calls": tool_calls} if tool_calls else {})}
    chat = {"model": "agent@3", "created": 1, "usage": {"prompt_tokens": 4, "completion_tokens": len(ids),
                                                        "total_tokens": 4 + len(ids)},
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "token_ids": ids,
                         "token_logprobs": [-0.5] * len(ids), "forced_token_indices": [0]}]}
    for answer in (responses_answer(chat, {"model": "agent@3"}), messages_answer(chat)):
        choice = choice_from_answer(json.loads(json.dumps(answer)))
        assert choice.message.content == text and choice.finish_reason == finish
        got = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
        assert got == [(n, a) for n, a in calls]
        assert choice_token_ids(choice) == ids and choice_logprobs(choice) == [-0.5] * len(ids)
