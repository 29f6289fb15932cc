"""Capture from every protocol x transport x streaming: a rollout that speaks Chat Completions,
Completions, the Responses API or Anthropic's Messages API to the real server over real HTTP, through the
SDK (openai / anthropic), httpx, aiohttp or requests, streamed or not, is captured by
`capture_auto_trajectory` as one conversation of its two turns, and the trainer's tokenisation of it
trains exactly the token ids the server sampled, with the logprobs it returned. Histories that branch
or mix models are refused unless the caller says which to keep. One server for the module."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from live_server import LiveServer

import groupwise as gw
from groupwise.core.trajectory import Choice
from groupwise.errors import AmbiguousHistoryError
from groupwise.training.tokenize import tokenize_conversation

PROTOCOLS = ("chat", "completions", "responses", "messages")
TRANSPORTS = ("sdk", "httpx", "aiohttp", "requests")
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "responses": "/v1/responses",
         "messages": "/v1/messages"}
MORE_IDS = [1849, 314]  # a completion's follow-up, as token ids


@pytest.fixture(scope="module")
def server(served):
    engine, registry, app = served
    with LiveServer(app) as live:
        yield live, engine.tokenizer


# ---------------------------------------------------------------------------------- the agent's side


def sampled(protocol: str, payloads: list[dict]) -> dict:
    """What the server sampled, read from its answer (the JSON bodies, or each streamed event's data) by
    this test's own reading of each protocol: text, token ids, logprobs (and a completion's prompt ids)."""
    text, ids, logprobs, prompt = "", [], [], None
    for p in payloads:
        if protocol == "chat":
            for c in p.get("choices") or []:
                part = c.get("message") or c.get("delta") or {}
                text += part.get("content") or ""
                ids += c.get("token_ids") or []
                logprobs += c.get("token_logprobs") or [e["logprob"] for e in (c.get("logprobs") or {}).get(
                    "content") or []]
        elif protocol == "completions":
            for c in p.get("choices") or []:
                text += c["text"]
                ids += c["token_ids"]
                logprobs += c["logprobs"]["token_logprobs"]
                prompt = c["prompt_token_ids"]
        elif protocol == "responses":
            final = p.get("type") in ("response.completed", "response.incomplete")  # 4 tokens: incomplete
            r = p.get("response") if final else p if p.get("object") == "response" else None
            if r is not None:
                text = "".join(part["text"] for item in r["output"] if item["type"] == "message"
                               for part in item["content"])
                ids, logprobs = r["token_ids"], r["token_logprobs"]
        else:
            m = p.get("message") if p.get("type") == "message_start" else p if p.get("type") == "message" else None
            if m is not None:
                ids, logprobs = m["token_ids"], m["token_logprobs"]
                text += "".join(b["text"] for b in m["content"] if b["type"] == "text")
            if p.get("type") == "content_block_delta" and p["delta"]["type"] == "text_delta":
                text += p["delta"]["text"]
    return {"text": text, "ids": ids, "logprobs": logprobs, "prompt": prompt}


def request(protocol: str, turn: int, before: dict | None) -> dict:
    """The body of turn 1, or of turn 2 sending back turn 1's answer (`before`) and a new user turn."""
    user = {"role": "user", "content": "Name a colour."}
    again = {"role": "user", "content": "And another?"}
    if protocol == "completions":
        prompt = "Colours: red," if turn == 1 else before["prompt"] + before["ids"] + MORE_IDS
        return {"model": "agent", "prompt": prompt, "max_tokens": 4, "seed": turn, "logprobs": 0}
    if protocol == "responses":
        items = [{"type": "message", "role": "user", "content": user["content"]}]
        if turn == 2:
            items += [{"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": before["text"]}]},
                      {"type": "message", "role": "user", "content": again["content"]}]
        return {"model": "agent", "input": items, "max_output_tokens": 4, "seed": turn}
    messages = [user] if turn == 1 else [user, {"role": "assistant", "content": before["text"]}, again]
    body = {"model": "agent", "messages": messages, "max_tokens": 4}
    return {**body, "seed": turn} if protocol == "chat" else body


def sse_payloads(body: bytes) -> list[dict]:
    out = []
    for line in body.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            out.append(json.loads(line[5:]))
    return out


async def call(live, protocol: str, transport: str, body: dict, stream: bool) -> list[dict]:
    """Send `body` by `transport` (streamed: read as the caller of that library reads a stream); the
    answer's JSON payloads."""
    url = live.url + PATHS[protocol]
    body = {**body, "stream": True} if stream else body
    key = getattr(live, "key", None)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if transport == "sdk":
        return await sdk_call(live, protocol, body, stream)
    if transport == "httpx":
        import httpx

        async with httpx.AsyncClient(timeout=60, headers=headers) as client:
            if not stream:
                return [(await client.post(url, json=body)).json()]
            lines = []
            async with client.stream("POST", url, json=body) as response:
                async for line in response.aiter_lines():
                    lines.append(line)
            return sse_payloads("\n".join(lines).encode())
    if transport == "aiohttp":
        import aiohttp

        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.post(url, json=body) as response:
                if not stream:
                    return [await response.json()]
                return sse_payloads(b"".join([line async for line in response.content]))

    def blocking() -> list[dict]:
        import requests

        with requests.Session() as session:
            session.headers.update(headers)
            if not stream:
                return [session.post(url, json=body, timeout=60).json()]
            with session.post(url, json=body, stream=True, timeout=60) as response:
                return sse_payloads("\n".join(response.iter_lines(decode_unicode=True)).encode())

    return await asyncio.to_thread(blocking)


async def sdk_call(live, protocol: str, body: dict, stream: bool) -> list[dict]:
    import anthropic
    import openai

    body = dict(body)
    if protocol == "messages":
        async with anthropic.AsyncAnthropic(base_url=live.url, api_key=getattr(live, "key", None) or "unused",
                                            max_retries=0) as client:
            answer = await client.messages.create(**body)
            if not stream:
                return [answer.model_dump()]
            return [event.model_dump() async for event in answer]
    async with openai.AsyncOpenAI(base_url=live.url + "/v1", api_key=getattr(live, "key", None) or "unused",
                                  max_retries=0) as client:
        extra = {k: body.pop(k) for k in ("seed",) if protocol == "responses" and k in body}
        create = {"chat": client.chat.completions.create, "completions": client.completions.create,
                  "responses": client.responses.create}[protocol]
        answer = await create(**body, **({"extra_body": extra} if extra else {}))
        if not stream:
            return [answer.model_dump()]
        return [event.model_dump() async for event in answer]


# ---------------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_a_rollout_of_any_protocol_transport_and_streaming_trains_the_sampled_tokens(
        server, protocol, transport, stream):
    live, tokenizer = server
    turns: list[dict] = []

    async def rollout() -> None:
        before = None
        for turn in (1, 2):
            before = sampled(protocol, await call(live, protocol, transport, request(protocol, turn, before), stream))
            turns.append(before)
        gw.auto_trajectory(required=True).reward = 1.0

    t = await gw.capture_auto_trajectory(rollout())

    assert all(turn["ids"] for turn in turns) and t.reward == 1.0
    assert t.additional_histories == []  # turn 2 continues turn 1: one conversation
    choices = [c for c in t.messages_and_choices if isinstance(c, Choice)]
    assert len(choices) == 2
    ids, mask, old = tokenize_conversation(t.messages_and_choices, tokenizer, tools=t.tools)
    trained = [i for i, m in zip(ids, mask) if m]
    assert trained == turns[0]["ids"] + turns[1]["ids"]  # the trained tokens are the sampled ones
    trained_logprobs = [x for x, m in zip(old, mask) if m]
    assert trained_logprobs == pytest.approx(turns[0]["logprobs"] + turns[1]["logprobs"], abs=1e-6)
    assert not any(math.isnan(x) for x in trained_logprobs)
    if protocol == "completions":  # the exact sequence the server sampled from, nothing re-tokenised
        assert ids == turns[1]["prompt"] + turns[1]["ids"]
    else:
        assert [c.message.content or "" for c in choices] == [turn["text"] for turn in turns]


# ---------------------------------------------------------------------------------- ambiguous histories


async def test_a_history_that_branches_is_refused_unless_told_which_branch_to_keep(server):
    live, tokenizer = server

    async def rollout(follow_ups: tuple[str, ...]) -> None:
        first = sampled("chat", await call(live, "chat", "httpx", request("chat", 1, None), False))
        for text in follow_ups:  # each goes back to turn 1 and continues differently
            body = request("chat", 2, first)
            body["messages"][-1]["content"] = text
            await call(live, "chat", "httpx", body, False)

    await gw.capture_auto_trajectory(rollout(("And another?",)))  # one branch: a plain conversation
    with pytest.raises(AmbiguousHistoryError, match=r"branches off.*branches='last'.*branches='split'"):
        await gw.capture_auto_trajectory(rollout(("And another?", "Why?")))
    last = await gw.capture_auto_trajectory(rollout(("And another?", "Why?")), branches="last")
    assert last.additional_histories == [] and last.messages_and_choices[-2]["content"] == "Why?"
    split = await gw.capture_auto_trajectory(rollout(("And another?", "Why?")), branches="split")
    (other,) = split.additional_histories
    assert split.messages_and_choices[-2]["content"] == "And another?" and other.messages_and_choices[-2]["content"] == "Why?"
    # the shared first turn keeps its sampled tokens in both branches
    assert split.messages_and_choices[1] is other.messages_and_choices[1]
    assert isinstance(other.messages_and_choices[1], Choice)
    with pytest.raises(gw.GroupwiseError, match="branches="):
        await gw.capture_auto_trajectory(rollout(()), branches="first")


async def test_a_branching_text_completion_is_refused_too(server):
    live, _ = server

    async def rollout() -> None:
        first = sampled("completions", await call(live, "completions", "requests",
                                                  request("completions", 1, None), False))
        for more in ([1849], [2000, 2001]):
            body = request("completions", 2, first)
            body["prompt"] = first["prompt"] + first["ids"] + more
            await call(live, "completions", "requests", body, False)

    with pytest.raises(AmbiguousHistoryError, match="first .* tokens"):
        await gw.capture_auto_trajectory(rollout())
    split = await gw.capture_auto_trajectory(rollout(), branches="split")
    assert len(split.additional_histories) == 1


async def test_calls_to_two_models_are_refused_unless_the_model_to_train_is_named(server):
    live, _ = server

    async def rollout() -> None:
        await call(live, "chat", "aiohttp", request("chat", 1, None), False)
        judge = {**request("chat", 1, None), "model": "tiny"}  # the base model as a judge
        await call(live, "messages", "sdk", {**request("messages", 1, None), "model": "agent@1"}, True)
        await call(live, "chat", "aiohttp", judge, False)

    with pytest.raises(AmbiguousHistoryError, match=r"2 models \(\['agent', 'tiny'\]\).*model='agent'"):
        await gw.capture_auto_trajectory(rollout())
    t = await gw.capture_auto_trajectory(rollout(), model="agent")  # agent@1 is one of agent's checkpoints
    (other,) = t.additional_histories  # the second call asked the same first question afresh
    assert len(t.choices()) == 1 and t.choices()[0].model_extra["policy_versions"][0] == 2
    assert other.messages_and_choices[1].model_extra["policy_versions"][0] == 1
    judged = await gw.capture_auto_trajectory(rollout(), model="tiny")
    assert len(judged.choices()) == 1


async def test_captured_rollouts_of_every_protocol_train_one_step_on_the_sampled_tokens(tiny_model_dir, tmp_path):
    # the real trainer on the captured trajectories (a text completion's on its prompt_token_ids): before
    # its update it computes the sampler's logprobs for every trained token, so the ratio is 1
    from types import SimpleNamespace

    model = gw.TrainableModel(name="agent", project="capture", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    live = SimpleNamespace(url=model.inference_base_url.rstrip("/").removesuffix("/v1"), key=model.inference_api_key)
    plans = {"completions": ("aiohttp", True), "responses": ("requests", True), "messages": ("httpx", False),
             "chat": ("sdk", True)}

    async def rollout(protocol: str, i: int) -> None:
        transport, stream = plans[protocol]
        before = None
        for turn in (1, 2):
            body = request(protocol, turn, before)
            body = {**body, "seed": 10 * i + turn} if protocol != "messages" else body
            before = sampled(protocol, await call(live, protocol, transport, body, stream))
        gw.auto_trajectory(required=True).reward = float(i)

    try:
        groups = [gw.TrajectoryGroup([await gw.capture_auto_trajectory(rollout(p, i)) for i in range(3)])
                  for p in plans]
        assert all(len(t.choices()) == 2 for g in groups for t in g.trajectories)
        result = await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        assert result.step == 1 and result.metrics["trainable_tokens"] >= 4 * 3 * 2 * 2
        assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    finally:
        await backend.close()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("protocol", ["chat", "responses", "messages"])
async def test_a_tool_call_sent_back_with_its_result_continues_the_conversation(server, protocol, stream):
    # the agent sends the call back in its own API's shape (a function_call item, a tool_use block): the
    # capture compares what the model saw, so the sampled call and its echo are one turn
    live, tokenizer = server
    tool = {"name": "lookup", "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "enum": ["red", "blue"]}},
                           "required": ["q"]}}  # a short call: a random model's free string runs long
    user = {"role": "user", "content": "Look up 'red'."}
    if protocol == "chat":
        first = {"model": "agent", "messages": [user], "max_tokens": 40, "tools": [{"type": "function", "function": tool}],
                 "tool_choice": "required"}
    elif protocol == "responses":
        first = {"model": "agent", "input": [user], "max_output_tokens": 40, "tools": [{"type": "function", **tool}],
                 "tool_choice": "required"}
    else:
        first = {"model": "agent", "messages": [user], "max_tokens": 40, "tool_choice": {"type": "any"},
                 "tools": [{"name": tool["name"], "description": tool["description"], "input_schema": tool["parameters"]}]}
    answers = []

    async def rollout() -> None:
        payloads = await call(live, protocol, "httpx", first, stream)
        answer = [p for p in payloads if p.get("object") == "response" or p.get("type") == "message"
                  or p.get("type") in ("response.completed", "response.incomplete")]
        if protocol == "chat":
            message = sampled_message(payloads)
            second = {**first, "messages": [user, message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                                                            "content": "a colour"}], "tool_choice": "none"}
        elif protocol == "responses":
            final = answer[-1].get("response", answer[-1])
            call_item = next(i for i in final["output"] if i["type"] == "function_call")
            second = {**first, "input": [user, *final["output"], {"type": "function_call_output",
                                                                   "call_id": call_item["call_id"], "output": "a colour"}],
                      "tool_choice": "none"}
        else:
            final = messages_final(payloads)
            use = next(b for b in final["content"] if b["type"] == "tool_use")
            second = {**first, "tool_choice": {"type": "none"}, "messages": [
                user, {"role": "assistant", "content": final["content"]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "a colour"}]}]}
        short = {"max_output_tokens": 3} if protocol == "responses" else {"max_tokens": 3}
        answers.append(await call(live, protocol, "httpx", {**second, **short}, stream))

    t = await gw.capture_auto_trajectory(rollout())
    assert answers and t.additional_histories == []
    roles = [m["role"] if isinstance(m, dict) else "choice" for m in t.messages_and_choices]
    assert roles == ["user", "choice", "tool", "choice"]
    assert t.messages_and_choices[1].message.tool_calls[0].function.name == "lookup"
    ids, mask, _ = tokenize_conversation(t.messages_and_choices, tokenizer, tools=t.tools)
    # every sampled token trains but those the grammar forced (TrainConfig.train_forced_tokens)
    assert sum(mask) == sum(len(c.model_extra["token_ids"]) - len(c.model_extra["forced_token_indices"])
                            for c in t.choices()) > 0


def sampled_message(payloads: list[dict]) -> dict:
    """The assistant message of a chat answer (plain, or its stream's deltas joined)."""
    if payloads[0].get("object") == "chat.completion":
        m = payloads[0]["choices"][0]["message"]
        return {"role": "assistant", "content": m.get("content"), "tool_calls": m["tool_calls"]}
    content, calls = "", []
    for p in payloads:
        for c in p.get("choices") or []:
            delta = c.get("delta") or {}
            content += delta.get("content") or ""
            for d in delta.get("tool_calls") or []:
                while len(calls) <= d["index"]:
                    calls.append({"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                calls[d["index"]]["id"] += d.get("id") or ""
                calls[d["index"]]["function"]["name"] += (d.get("function") or {}).get("name") or ""
                calls[d["index"]]["function"]["arguments"] += (d.get("function") or {}).get("arguments") or ""
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def messages_final(payloads: list[dict]) -> dict:
    """The Message of a Messages answer (plain, or its stream's events put together)."""
    if payloads[0].get("type") == "message":
        return payloads[0]
    message, partial = None, {}
    for p in payloads:
        if p["type"] == "message_start":
            message = {**p["message"], "content": []}
        elif p["type"] == "content_block_start":
            message["content"].append(dict(p["content_block"]))
        elif p["type"] == "content_block_delta":
            block = message["content"][p["index"]]
            if p["delta"]["type"] == "text_delta":
                block["text"] = block.get("text", "") + p["delta"]["text"]
            else:
                partial[p["index"]] = partial.get(p["index"], "") + p["delta"]["partial_json"]
    for i, text in partial.items():
        message["content"][i]["input"] = json.loads(text)
    return message
