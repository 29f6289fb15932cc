"""Grammar-forced tokens: the engine reports each position where a choice's grammar allowed exactly one
token, the server returns them as ``choice.forced_token_indices`` and `choice_forced_indices` reads them."""

from __future__ import annotations

import asyncio

import pytest

from groupwise.core.choices import choice_forced_indices, choice_token_ids
from groupwise.inference.constrained import allowed_mask, constraint_for
from groupwise.inference.engine import Engine, GenerationRequest
from groupwise.inference.sampling import SamplingParams
from groupwise.runtime.loading import tiny_random_model

TOOLS = [  # two tools: the name is a decision, and so is the argument (an enum, a free string)
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}},
                       "required": ["city"]}}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]


def expected_forced(constraint, ids: list[int], vocab: int) -> list[int]:
    """Independently: step a fresh matcher through the sampled ids, counting the allowed tokens at each."""
    matcher, out = constraint.new_matcher(), []
    for k, t in enumerate(ids):
        mask = allowed_mask([matcher], vocab, "cpu")[0]
        assert mask[t], (k, t)  # the sampled token obeys the grammar
        if int(mask.sum()) == 1:
            out.append(k)
        assert matcher.consume_token(t)
    return out


@pytest.mark.parametrize("graphs", [False, True])  # True off CUDA: the graph decode path, run eagerly
async def test_forced_indices_are_exactly_the_single_allowed_positions(tiny, graphs):
    model, tok = tiny_random_model(seed=0, tokenizer=tiny[1])
    vocab = model.get_output_embeddings().weight.shape[0]
    constraint = constraint_for(tok, tools=TOOLS, tool_choice="required")
    prompt = tok.apply_chat_template(USER, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    eng = Engine(model, tok, max_batch_size=8, cuda_graphs=graphs)
    try:
        # one batch: three constrained choices beside an unconstrained request
        constrained, plain = await asyncio.gather(
            eng.generate(GenerationRequest(prompt, max_new_tokens=60, n=3, constraint=constraint,
                                           sampling=SamplingParams(temperature=1.0, seed=3))),
            eng.generate(GenerationRequest(prompt, max_new_tokens=20, ignore_eos=True,
                                           sampling=SamplingParams(temperature=1.0, seed=4))))
    finally:
        eng.close()
    for c in constrained.completions:
        assert c.finish_reason == "stop" and c.text.startswith("<tool_call>")
        want = expected_forced(constraint, c.token_ids, vocab)
        assert c.forced_indices == want
        # the grammar both forces and leaves choices (at least the tool's name and its argument)
        assert len(want) > 0 and len(c.token_ids) - len(want) >= 2
    assert plain.completions[0].forced_indices == []
    assert len(plain.completions[0].token_ids) == 20


async def test_forced_indices_over_http(live, tiny):
    model, tok = tiny
    client = live.client()
    r = await client.chat.completions.create(model="agent@0", messages=USER, tools=TOOLS, tool_choice="required",
                                             max_tokens=60, seed=5)
    choice = r.choices[0]
    ids, forced = choice_token_ids(choice), choice_forced_indices(choice)
    assert choice.model_extra["forced_token_indices"] == forced
    constraint = constraint_for(tok, tools=TOOLS, tool_choice="required")
    assert forced == expected_forced(constraint, ids, model.get_output_embeddings().weight.shape[0])
    assert len(forced) > 0 and len(ids) - len(forced) >= 2
    # streamed: the finish chunk carries the same indices (same seed, same tokens)
    stream = await client.chat.completions.create(model="agent@0", messages=USER, tools=TOOLS, tool_choice="required",
                                                  max_tokens=60, seed=5, stream=True)
    chunks = [c async for c in stream]
    streamed_ids = [t for c in chunks for ch in c.choices for t in (ch.model_extra.get("token_ids") or [])]
    final = [ch for c in chunks for ch in c.choices if ch.finish_reason][0]
    assert streamed_ids == ids and final.model_extra["forced_token_indices"] == forced
    # unconstrained: none
    plain = await client.chat.completions.create(model="agent@0", messages=USER, max_tokens=8, seed=5)
    assert choice_forced_indices(plain.choices[0]) == [] and plain.choices[0].model_extra["forced_token_indices"] == []


async def test_a_forced_call_of_tools_whose_schemas_hold_defs_and_refs(live):
    """pydantic writes a nested model as "$defs" with "$ref": "#/$defs/Address" (and a recursive one as a
    reference back to itself): pointers from the parameters' root, which the forced call's grammar must
    keep meaning the same (they once pointed at nothing there: a 400). Every forced call parses as
    its tool's model."""
    from typing import Literal

    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=4)

    class Person(BaseModel):
        name: Literal["Ann", "Bob"]
        home: Address

    class Node(BaseModel):
        v: int = Field(ge=0, le=9)
        kids: list["Node"] = Field(max_length=1)

    models = {"person": Person, "node": Node}
    tools = [{"type": "function", "function": {"name": n, "parameters": m.model_json_schema()}} for n, m in models.items()]
    assert "$defs" in tools[0]["function"]["parameters"] and "$ref" in str(tools[1]["function"]["parameters"])
    client = live.client()
    calls = []
    for seed, choice in [(1, "required"), (2, "required"), (3, {"type": "function", "function": {"name": "node"}}),
                         (4, {"type": "function", "function": {"name": "person"}})]:
        r = await client.chat.completions.create(model="agent@0", messages=USER, tools=tools, tool_choice=choice,
                                                 max_tokens=400, seed=seed)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        calls += r.choices[0].message.tool_calls
    for call in calls:
        models[call.function.name].model_validate_json(call.function.arguments)
    assert {c.function.name for c in calls[2:]} == {"node", "person"}
