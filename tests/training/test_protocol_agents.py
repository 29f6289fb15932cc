"""Agents written against OpenAI's Responses API and Anthropic's Messages API train on the local backend:
their answers (through the real SDKs, over HTTP) become trajectories, and the trainer reproduces the
sampler's logprobs from them (the prompt rendered from the translated messages is the one sampled from)."""

from __future__ import annotations

from typing import Literal

import anthropic
import openai
import pytest

import groupwise as gw
from groupwise.chat.protocols import chat_messages, choice_from_answer, responses_to_chat

TOOLS = [{"type": "function", "name": "lookup", "description": "look a word up",
          "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}]


async def _responses_group(model, client: openai.AsyncOpenAI, g: int) -> gw.TrajectoryGroup:
    trajectories = []
    for i in range(4):
        request = {"instructions": "answer briefly", "input": [{"role": "user", "content": f"scenario {g}"}],
                   "tools": TOOLS}
        answer = await client.responses.create(model=model.inference_name(), max_output_tokens=5, **request)
        tools = responses_to_chat({"model": "", **request})["tools"]
        trajectories.append(gw.Trajectory(messages_and_choices=[*chat_messages(request), choice_from_answer(answer)],
                                          tools=tools, reward=float(i)))
    return gw.TrajectoryGroup(trajectories)


async def _messages_group(model, client: anthropic.AsyncAnthropic, g: int) -> gw.TrajectoryGroup:
    trajectories = []
    for i in range(4):
        request = {"system": "answer briefly", "messages": [{"role": "user", "content": f"scenario {g}"}]}
        async with client.messages.stream(model=model.inference_name(), max_tokens=5, **request) as stream:
            answer = await stream.get_final_message()
        trajectories.append(gw.Trajectory(messages_and_choices=[*chat_messages(request), choice_from_answer(answer)],
                                          reward=float(i)))
    return gw.TrajectoryGroup(trajectories)


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_an_agent_on_each_api_trains_two_steps(api, tiny_model_dir, tmp_path):
    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    base_url = model.inference_base_url
    if api == "responses":
        client = openai.AsyncOpenAI(base_url=base_url, api_key=model.inference_api_key or "unused", max_retries=0)
    else:
        client = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/").removesuffix("/v1"),
                                          api_key=model.inference_api_key or "unused", max_retries=0)
    make_group = _responses_group if api == "responses" else _messages_group
    try:
        for step in (1, 2):
            groups = [await make_group(model, client, g) for g in range(2)]
            result = await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
            assert result.step == step and await model.get_step() == step
            assert result.metrics["trainable_tokens"] > 0
            # the sampler's logprobs are what the trainer computes before its update (fp32 CPU): the
            # trajectory holds the tokens sampled, on the prompt they were sampled from
            assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        if api == "responses":
            answer = await client.responses.create(model=model.inference_name(), input="hi", max_output_tokens=2)
        else:
            answer = await client.messages.create(model=model.inference_name(), max_tokens=2,
                                                  messages=[{"role": "user", "content": "hi"}])
        assert answer.model == "agent@2"
    finally:
        await client.close()
        await backend.close()


async def test_an_openai_agents_sdk_agent_trains_two_steps(tiny_model_dir, tmp_path):
    """The Agents SDK's Agent, on OpenAIResponsesModel, runs a tool turn against the server; the Response
    objects it received (recorded at the client) become the trajectory and train."""
    import agents  # openai-agents (the dev extra)

    model = gw.TrainableModel(name="agent", project="p", base_model=tiny_model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    client = openai.AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key or "unused",
                                max_retries=0)
    seen: list = []  # (request kwargs, Response) of every call the agent made
    create = client.responses.create

    async def recording_create(**kwargs):
        answer = await create(**kwargs)
        seen.append((kwargs, answer))
        return answer

    client.responses.create = recording_create
    agents.set_tracing_disabled(True)

    @agents.function_tool
    def lookup(word: Literal["cat", "dog"]) -> str:  # a short call: the tiny model writes it under the grammar
        """Look a word up."""
        return f"{word}: a word"

    try:
        for step in (1, 2):
            groups = []
            for g in range(2):
                trajectories = []
                for i in range(4):
                    seen.clear()
                    agent = agents.Agent(
                        name="helper", instructions="answer briefly", tools=[lookup],
                        tool_use_behavior="stop_on_first_tool",
                        model=agents.OpenAIResponsesModel(model=model.inference_name(), openai_client=client),
                        model_settings=agents.ModelSettings(tool_choice="lookup", max_tokens=40))
                    result = await agents.Runner.run(agent, f"scenario {g}")
                    assert result.final_output.endswith(": a word")  # the tool ran on the model's call
                    (request, answer), = seen
                    body = {k: v for k, v in request.items() if k in ("input", "instructions", "tools")}
                    trajectories.append(gw.Trajectory(
                        messages_and_choices=[*chat_messages(body), choice_from_answer(answer)],
                        tools=responses_to_chat({"model": "", **body})["tools"], reward=float(i)))
                groups.append(gw.TrajectoryGroup(trajectories))
            result = await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
            assert result.step == step
            assert result.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    finally:
        await client.close()
        await backend.close()
