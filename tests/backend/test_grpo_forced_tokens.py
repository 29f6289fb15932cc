"""GRPO through a real LocalBackend on tool calls sampled under tool_choice="required": the tokens the
grammar forced are left out of the step (TrainConfig.train_forced_tokens=False, the default), and
trained when asked."""

from __future__ import annotations

import asyncio

import groupwise as gw
from groupwise.core.choices import choice_forced_indices, choice_token_ids

TOOLS = [{"type": "function", "function": {"name": name, "description": "a tool", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}}}
    for name in ("get_weather", "get_time")]


async def forced_groups(model, step):
    client = model.openai_client()

    async def one(g, i):
        messages = [{"role": "user", "content": f"scenario {g}"}]
        r = await client.chat.completions.create(model=model.inference_name(), messages=messages, tools=TOOLS,
                                                 tool_choice="required", max_tokens=40, seed=100 * step + 10 * g + i)
        return gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], tools=TOOLS, reward=float(i))

    return [gw.TrajectoryGroup(await asyncio.gather(*(one(g, i) for i in range(3)))) for g in range(2)]


def counts(groups):
    choices = [t.messages_and_choices[-1] for g in groups for t in g]
    return sum(len(choice_token_ids(c)) for c in choices), sum(len(choice_forced_indices(c)) for c in choices)


async def test_forced_tokens_are_left_out_of_the_step_unless_asked(tiny_model_dir, tmp_path):
    backend = gw.LocalBackend(path=str(tmp_path), device="cpu")
    model = gw.TrainableModel("agent", project="forced", base_model=tiny_model_dir)
    await model.register(backend)
    try:
        groups = await forced_groups(model, 0)
        sampled, forced = counts(groups)
        assert 0 < forced < sampled
        result = await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3))
        assert result.metrics["trainable_tokens"] == sampled - forced
        assert result.metrics["forced_tokens"] == forced
        groups = await forced_groups(model, 1)
        sampled, forced = counts(groups)
        result = await model.train(groups, config=gw.TrainConfig(learning_rate=1e-3, train_forced_tokens=True))
        assert forced > 0 and result.metrics["trainable_tokens"] == sampled
        assert result.metrics["forced_tokens"] == 0
    finally:
        await backend.close()
