"""ART's captured trajectories (`capture_auto_trajectory`, `auto_trajectory`, `capture_yielded_trajectory`,
`yield_trajectory`) and `art.openai`'s stream consumer, against the real server of a LocalBackend with
the tiny model: what a rollout's calls become, that streamed and plain calls record the same tokens,
that concurrent rollouts stay apart, and that the captured trajectories train."""

from __future__ import annotations

import asyncio

import pytest

import groupwise as art
from groupwise import GroupwiseError
from groupwise.core.choices import choice_token_ids
from groupwise.errors import InvalidDataError
from groupwise.core.chat_stream import consume_chat_completion_stream
from groupwise.core.trajectory import Choice

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                           "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


@pytest.fixture
async def model(tiny_model_dir, tmp_path):
    backend = art.LocalBackend(path=str(tmp_path))
    model = art.TrainableModel(name="agent", project="captures", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        yield model
    finally:
        await backend.close()


async def test_a_captured_rollout_is_its_calls_as_conversations_and_trains(model):
    client = model.openai_client()
    seen: dict[str, list] = {}

    async def rollout(task: str, seed: int) -> None:
        # ART style: the rollout builds no Trajectory; it calls the model and scores the result.
        messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": task}]
        first = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=6, seed=seed,
                                                     tools=TOOLS)
        messages += [first.choices[0].message, {"role": "user", "content": "And then?"}]
        # The second turn streams; the rollout reads the chunks itself.
        stream = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=5,
                                                      seed=seed, stream=True, tools=TOOLS)
        text, ids = "", []
        async for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
                ids += (c.model_extra or {}).get("token_ids") or []
        # A side call (a summariser): a conversation of its own.
        side = await client.chat.completions.create(model=model.name, max_tokens=4, seed=seed,
                                                    messages=[{"role": "user", "content": f"Summarise: {task}"}])
        seen[task] = [first.choices[0], text, ids, side.choices[0]]
        art.auto_trajectory(required=True).reward = float(seed)
        art.auto_trajectory(required=True).metadata["task"] = task

    tasks = [f"word {i}" for i in range(4)]
    captured = await asyncio.gather(*(art.capture_auto_trajectory(rollout(t, i)) for i, t in enumerate(tasks)))

    for i, (task, t) in enumerate(zip(tasks, captured)):
        first, text, ids, side = seen[task]
        assert (t.reward, t.metadata["task"]) == (float(i), task)  # each rollout's own, despite the gather
        items = t.messages_and_choices
        assert [m["role"] if isinstance(m, dict) else "choice" for m in items] == [
            "system", "user", "choice", "user", "choice"]
        assert items[1]["content"] == task and t.tools == TOOLS
        assert choice_token_ids(items[2]) == choice_token_ids(first) and items[2].message.content == first.message.content
        streamed = items[4]
        assert isinstance(streamed, Choice) and streamed.message.content == text and choice_token_ids(streamed) == ids
        assert len(ids) >= 1
        assert len(t.additional_histories) == 1
        (h,) = t.additional_histories
        assert h.messages_and_choices[0]["content"] == f"Summarise: {task}"
        assert choice_token_ids(h.messages_and_choices[1]) == choice_token_ids(side)
        assert t.metrics["duration"] > 0

    assert art.auto_trajectory() is None
    with pytest.raises(GroupwiseError, match="outside capture_auto_trajectory"):
        art.auto_trajectory(required=True)

    result = await model.train([art.TrajectoryGroup(captured[:2]), art.TrajectoryGroup(captured[2:])],
                               config=art.TrainConfig(learning_rate=1e-4))
    assert await model.get_step() == 1
    assert result is None or getattr(result, "step", 1) == 1


async def test_a_blocking_client_over_http_in_a_worker_thread_is_captured(model):
    import openai

    # ART programs hand model.inference_base_url to other clients; a sync one runs in a worker thread
    # (asyncio.to_thread copies the rollout's context, so the capture is current there too).
    sync = openai.OpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    messages = [{"role": "user", "content": "Name a colour."}]

    async def rollout() -> None:
        r = await asyncio.to_thread(sync.chat.completions.create, model=model.name, messages=messages,
                                    max_tokens=5, seed=1)
        stream = await asyncio.to_thread(sync.chat.completions.create, model=model.name, max_tokens=4, seed=2,
                                         messages=[{"role": "user", "content": "Again?"}], stream=True)
        streamed = await asyncio.to_thread(lambda: "".join(c.choices[0].delta.content or "" for c in stream
                                                           if c.choices))
        rollout.answers = (r.choices[0], streamed)

    t = await art.capture_auto_trajectory(rollout())
    answer, streamed = rollout.answers
    assert t.messages_and_choices[0] == messages[0]
    assert choice_token_ids(t.messages_and_choices[1]) == choice_token_ids(answer) and len(choice_token_ids(answer)) >= 1
    (h,) = t.additional_histories
    assert h.messages_and_choices[1].message.content == streamed
    sync.close()


async def test_a_streamed_completion_consumed_equals_the_plain_one(model):
    client = model.openai_client()
    messages = [{"role": "user", "content": "Count with me"}]
    plain = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=8, seed=3, n=3,
                                                 logprobs=True)
    stream = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=8, seed=3, n=3,
                                                  logprobs=True, stream=True)
    chunks = []
    consumed = await consume_chat_completion_stream(stream, on_chunk=lambda chunk, _so_far: chunks.append(chunk))
    assert len(chunks) > 3
    assert [c.index for c in consumed.choices] == [0, 1, 2]
    for a, b in zip(plain.choices, consumed.choices):
        # each choice from its own chunks (merged by index), groupwise's token ids joined
        assert b.message.content == a.message.content and b.finish_reason == a.finish_reason
        assert choice_token_ids(b) == choice_token_ids(a)
        assert [e.token for e in b.logprobs.content] == [e.token for e in a.logprobs.content]

    stream = await client.chat.completions.create(model=model.name, messages=messages, max_tokens=8, seed=3,
                                                  stream=True)

    def stop_after_two(_chunk, _so_far):
        stop_after_two.calls += 1
        if stop_after_two.calls == 2:
            raise StopIteration
    stop_after_two.calls = 0
    early = await consume_chat_completion_stream(stream, on_chunk=stop_after_two)
    assert stop_after_two.calls == 2 and len(choice_token_ids(early.choices[0]) or []) == 1

    async def nothing():
        return
        yield

    with pytest.raises(InvalidDataError, match="before its first chunk"):
        await consume_chat_completion_stream(nothing())


async def test_a_yielded_trajectory_is_captured_and_yielding_alone_is_harmless():
    async def rollout(reward: float) -> art.Trajectory:
        t = art.Trajectory(messages_and_choices=[{"role": "user", "content": "hi"}], reward=reward)
        await asyncio.sleep(0)
        art.yield_trajectory(t)
        return t

    a, b = await asyncio.gather(art.capture_yielded_trajectory(rollout(1.0)), art.capture_yielded_trajectory(rollout(2.0)))
    assert (a.reward, b.reward) == (1.0, 2.0)
    assert (await rollout(3.0)).reward == 3.0  # outside a capture: accepted, no effect (as ART)

    async def forgets() -> None:
        await asyncio.sleep(0)

    with pytest.raises(GroupwiseError, match="without calling yield_trajectory"):
        await art.capture_yielded_trajectory(forgets())
    with pytest.raises(GroupwiseError, match="takes a Trajectory"):
        art.yield_trajectory({"reward": 1.0})


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_a_streamed_reply_holding_a_unicode_line_separator_is_put_back_whole(newline):
    # A server that writes its SSE JSON as UTF-8 (vLLM, OpenAI) keeps U+2028 or NEL raw in a chunk; the
    # capture split the stream with str.splitlines, which breaks there, and json.loads failed on half
    # an event. SSE lines end at CR, LF or CRLF only.
    import json

    from groupwise.core.exchanges import Exchange, call_of

    def event(delta: dict, finish=None) -> str:
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return "data: " + json.dumps(chunk, ensure_ascii=False) + newline + newline

    body = (event({"role": "assistant", "content": "a\u2028b"}) + event({"content": "c\x85d\u2029"}, "stop")
            + "data: [DONE]" + newline + newline).encode()
    request = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    choice = call_of(Exchange("/v1/chat/completions", request, body, streamed=True)).choice
    assert choice.message.content == "a\u2028bc\x85d\u2029" and choice.finish_reason == "stop"
