"""Token-in/token-out across the server and the trainer: a multi-turn, tool-using conversation served
over HTTP (the real `openai` client, the real server, the tiny model) and then tokenised for training
gives the trainer, turn by turn, exactly the prompt ids the engine prefilled and the ids it sampled.

Both sides render through the chat layer (groupwise.chat); before it, the trainer rendered tool calls
and tools the server's way only when a caller remembered to pass the server's renderer."""

from __future__ import annotations

import json

import pytest

from groupwise.core.choices import choice_token_ids
from groupwise.training.tokenize import tokenize_groups
from groupwise.core.trajectory import Trajectory, TrajectoryGroup

# SmolLM2's template has no tool support: the tools go into the system prompt, tool calls and results
# are written as text. The calls are forced (tool_choice) and their one free choice is a single digit:
# the grammar then admits one tokenisation of the call text, the one the server's re-rendering of the
# parsed call gives. (A free choice such as "Paris" may be sampled as "Par" + "is"; the OpenAI API
# carries the next request's history as text, so the server re-tokenises it as "Paris" whatever the
# renderer: that gap is the API's, not the chat layer's, and the last, free turn stays out of it.)
TOOLS = [{"type": "function", "function": {
    "name": "forecast", "description": "The weather in Paris, some days ahead",
    "parameters": {"type": "object", "properties": {"days": {"type": "integer", "enum": [1, 2, 3]}},
                   "required": ["days"]}}}]
FORCED = {"type": "function", "function": {"name": "forecast"}}


@pytest.fixture
def engine_calls(served, monkeypatch):
    """Every request the engine takes, with its answer: (prompt ids prefilled, ids sampled)."""
    engine = served[0]
    calls: list[tuple[list[int], object]] = []
    submit = engine.submit

    def recording(req):
        future = submit(req)
        calls.append((list(req.prompt_ids), future))
        return future

    monkeypatch.setattr(engine, "submit", recording)
    return calls


def mask_runs(mask: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    runs, start = [], None
    for t, m in enumerate([*mask, False]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            runs.append((start, t))
            start = None
    return runs


async def test_trainer_sees_the_prompts_the_engine_prefilled_turn_by_turn(live, served, engine_calls):
    tokenizer = served[0].tokenizer
    client = live.client()
    items: list = [{"role": "system", "content": "You answer questions about the weather."},
                   {"role": "user", "content": "Will it be warm in Paris tomorrow, and the day after?"}]
    # Two forced tool calls, each answered by the tool, then a free final answer.
    for turn, tool_choice in enumerate([FORCED, "required", "auto"]):
        messages = [m if isinstance(m, dict) else m.message.model_dump(exclude_none=True) for m in items]
        r = await client.chat.completions.create(model="agent", messages=messages, tools=TOOLS, tool_choice=tool_choice,
                                                 max_tokens=40 if turn < 2 else 6, seed=turn)
        choice = r.choices[0]
        items.append(choice)
        if turn < 2:
            call = choice.message.tool_calls[0]
            items.append({"role": "tool", "tool_call_id": call.id,
                          "content": json.dumps({"days": json.loads(call.function.arguments)["days"], "temp_c": 20})})
    choices = [c for c in items if not isinstance(c, dict)]
    assert [c.finish_reason for c in choices[:2]] == ["tool_calls", "tool_calls"]
    assert len(engine_calls) == 3
    prefilled = [prompt for prompt, _ in engine_calls]
    sampled = [future.result().completions[0].token_ids for _, future in engine_calls]
    assert [choice_token_ids(c) for c in choices] == sampled  # what the client got is what the engine sampled
    # A later prompt re-renders an earlier call from its parsed tool_calls (the API carries text, not ids);
    # the grammar's call text re-renders to the very ids sampled, so the later prompts extend the earlier ones.
    for k in (1, 2):
        assert prefilled[k][:len(prefilled[k - 1]) + len(sampled[k - 1])] == prefilled[k - 1] + sampled[k - 1]

    trajectory = Trajectory(messages_and_choices=items, tools=TOOLS, reward=1.0)
    other = Trajectory(messages_and_choices=items, tools=TOOLS, reward=0.0)
    batch = tokenize_groups([TrajectoryGroup([trajectory, other])], tokenizer, max_seq_len=4096,
                            train_forced_tokens=True)  # every sampled token in the mask: one run per turn
    seq = batch.sequences[0]
    runs = mask_runs(seq.mask)
    assert len(runs) == 3
    for k, (start, end) in enumerate(runs):
        assert seq.input_ids[:start] == prefilled[k], f"turn {k}: the trainer's context is not the served prompt"
        assert seq.input_ids[start:end] == sampled[k], f"turn {k}: the trainer's tokens are not the sampled ones"
    assert seq.input_ids[:runs[-1][1]] == prefilled[2] + sampled[2]


async def test_tools_with_tool_choice_none_are_in_the_served_prompt_as_in_the_trained_one(live, served, engine_calls):
    # tool_choice="none" forbids a call, not the tools: the model still sees them (as OpenAI's and vLLM's
    # servers render them), and the trajectory, which keeps the tools but not the tool_choice, is trained
    # with them in its context. A server that dropped them would have sampled from another prompt.
    tokenizer = served[0].tokenizer
    messages = [{"role": "user", "content": "Is it warm in Paris?"}]
    r = await live.client().chat.completions.create(model="agent", messages=messages, tools=TOOLS,
                                                    tool_choice="none", max_tokens=6, seed=0)
    choice = r.choices[0]
    assert choice.message.tool_calls is None  # "none": whatever it wrote is content
    [(prefilled, future)] = engine_calls
    assert "forecast" in tokenizer.decode(prefilled)  # the tools are in the prompt the engine sampled from
    trajectory = Trajectory(messages_and_choices=[*messages, choice], tools=TOOLS, reward=1.0)
    other = Trajectory(messages_and_choices=[*messages, choice], tools=TOOLS, reward=0.0)
    seq = tokenize_groups([TrajectoryGroup([trajectory, other])], tokenizer, max_seq_len=4096).sequences[0]
    [(start, end)] = mask_runs(seq.mask)
    assert seq.input_ids[:start] == prefilled
    assert seq.input_ids[start:end] == future.result().completions[0].token_ids
