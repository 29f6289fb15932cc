"""groupwise.langgraph, ART's `art.langgraph`: a real LangGraph agent (a StateGraph with LangGraph's
ToolNode, LangChain's ChatOpenAI) runs against the LocalBackend's server and is trained for two steps.

The agent is the canonical ReAct loop: the model must call a tool on its first turn (tool_choice
"required": the tiny random model writes a valid call only under a grammar), the tool runs, the model
answers. The test checks that the trajectory the wrapper builds is exactly what the model saw and
sampled, by letting the trainer recompute the sampled tokens' logprobs: a ratio of 1 means the context
and tokens match the sampling to the last token.
"""

from __future__ import annotations

import asyncio
import json
import math
import warnings
from typing import Literal

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.messages import HumanMessage, SystemMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langgraph.graph import START, MessagesState, StateGraph  # noqa: E402
from langgraph.prebuilt import ToolNode, tools_condition  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import groupwise as art  # noqa: E402
from groupwise.core.choices import choice_forced_indices, choice_logprobs, choice_token_ids  # noqa: E402
from groupwise.errors import GroupwiseError  # noqa: E402
from groupwise.langgraph import init_chat_model, wrap_rollout  # noqa: E402
from groupwise.local import LocalBackend  # noqa: E402

POPULATION = {"paris": "Paris: 2.1 million people.", "rome": "Rome: 2.8 million people.", "oslo": "Oslo: 0.7 million."}


@tool
def lookup(city: Literal["paris", "rome", "oslo"]) -> str:
    """Look up how many people live in a city."""
    return POPULATION[city]


def build_agent(llm):
    async def agent(state: MessagesState):
        used_a_tool = any(m.type == "tool" for m in state["messages"])
        # the call needs ~30 tokens of grammar; the answer is kept short to keep the test fast
        bound = llm.bind_tools([lookup], tool_choice="auto" if used_a_tool else "required",
                               max_tokens=8 if used_a_tool else 40)
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


async def rollout(model: art.Model, city: str, seed: int) -> art.Trajectory:
    # as ART's docs write it: the model name is passed and ignored; sampling settings are ChatOpenAI's
    llm = init_chat_model(model.name, temperature=1.0, seed=seed)
    result = await build_agent(llm).ainvoke(
        {"messages": [SystemMessage("Answer with the population of the city."), HumanMessage(f"How many live in {city}?")]},
        config={"recursion_limit": 8},
    )
    looked_up = [m.tool_calls[0]["args"]["city"] for m in result["messages"] if getattr(m, "tool_calls", None)]
    answer = result["messages"][-1].content or ""
    # right city, plus a graded part so rewards differ within a group
    return art.Trajectory(reward=float(looked_up[:1] == [city]) + (len(answer) % 7) / 7,
                          metrics={"right_city": float(looked_up[:1] == [city])})


def check_trajectory(t: art.Trajectory) -> int:
    """The ReAct turns in order, each tool result answering its own call; returns the sampled tokens."""
    system, user, call, tool_result, answer = t.messages_and_choices
    assert (system["role"], user["role"], tool_result["role"]) == ("system", "user", "tool")
    assert isinstance(call, art.types.Choice) and isinstance(answer, art.types.Choice)
    (tool_call,) = call.message.tool_calls
    assert tool_call.function.name == "lookup"
    city = json.loads(tool_call.function.arguments)["city"]
    # the tool's real output, sent back under this trajectory's own call id: rollouts did not mix
    assert tool_result["content"] == POPULATION[city] and tool_result["tool_call_id"] == tool_call.id
    assert t.tools[0]["function"]["name"] == "lookup" and t.additional_histories == []
    sampled = 0
    for choice in (call, answer):
        ids, logprobs = choice_token_ids(choice), choice_logprobs(choice)
        assert ids and logprobs and len(ids) == len(logprobs)
        sampled += len(ids)
    # the tool call was written under a grammar: its fixed parts are marked forced, the city is not
    assert 0 < len(choice_forced_indices(call)) < len(choice_token_ids(call))
    return sampled


async def test_a_langgraph_agent_is_recorded_and_trained(tiny_model_dir, tmp_path):
    model = art.TrainableModel(name="agent", project="langgraph", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(tmp_path))
    await model.register(backend)
    results = []
    for step in range(2):
        groups = await art.gather_trajectory_groups(
            art.TrajectoryGroup(wrap_rollout(model, rollout)(model, city, seed=100 * step + i) for i in range(4))
            for city in ("paris", "rome")
        )
        sampled = sum(check_trajectory(t) for g in groups for t in g.trajectories)
        result = await backend.train(model, groups, learning_rate=1e-3)
        results.append(result)
        m = result.metrics
        assert result.step == step + 1 and m["skipped"] == 0.0 and m["zero_variance_fraction"] == 0.0
        # every sampled token of both turns of all 8 rollouts reached the trainer, trained or forced
        assert m["sequences"] == 8 and m["trainable_tokens"] + m["forced_tokens"] == sampled
        # the trainer's logprobs of the recorded tokens in the recorded context are the sampler's
        assert math.isclose(m["ratio_mean"], 1.0, abs_tol=2e-3)
    await backend.close()
    assert results[0].metrics["grad_norm"] > 0


class Verdict(BaseModel):
    city: Literal["paris", "rome"]


async def side_calls_rollout(model: art.Model) -> art.Trajectory:
    llm = init_chat_model(max_tokens=30)
    # LangChain's structured output (response_format json_schema, decoded under a grammar) and astream
    verdict = await llm.with_structured_output(Verdict).ainvoke("Pick a city.")
    chunks = [chunk async for chunk in llm.astream("Hi", max_tokens=3)]
    return art.Trajectory(reward=1.0, metadata={"city": verdict.city, "chunks": len(chunks)})


async def sync_node_rollout(model: art.Model, city: str) -> art.Trajectory:
    llm = init_chat_model(max_tokens=3)

    def answer(state: MessagesState):  # a sync node: LangGraph runs it in a worker thread
        return {"messages": [llm.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("answer", answer)
    graph.add_edge(START, "answer")
    await graph.compile().ainvoke({"messages": [HumanMessage(f"Weather in {city}?")]})
    return art.Trajectory()


async def prebuilt_agent_rollout(model: art.Model) -> art.Trajectory:
    # ART's docs' shape: LangGraph's prebuilt ReAct agent on init_chat_model (the tiny model answers in
    # text under tool_choice "auto", so the agent stops after one call)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated in LangGraph 1.x in favour of langchain's create_agent
        from langgraph.prebuilt import create_react_agent

        agent = create_react_agent(init_chat_model(model.name, max_tokens=4), [lookup])
    result = await agent.ainvoke({"messages": [HumanMessage("How many live in oslo?")]})
    return art.Trajectory(reward=float(len(result["messages"])))


async def test_init_chat_model_is_langchains_chat_model_on_the_in_process_endpoint(tiny_model_dir, tmp_path):
    model = art.TrainableModel(name="agent", project="langgraph", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(tmp_path), serve_http=False)  # no HTTP server: model.openai_client() only
    await model.register(backend)
    t = await wrap_rollout(model, side_calls_rollout)(model)
    assert t.metadata["chunks"] == 1  # not streamed: every call is recorded whole
    # two calls with unrelated prompts: the first is the trajectory's conversation, the second a history
    (structured,) = t.choices()
    assert json.loads(structured.message.content) == {"city": t.metadata["city"]}
    assert choice_token_ids(structured) and len(t.additional_histories) == 1
    assert t.additional_histories[0].messages_and_choices[0] == {"role": "user", "content": "Hi"}

    t = await wrap_rollout(model, prebuilt_agent_rollout)(model)
    user, answer = t.messages_and_choices
    assert user == {"role": "user", "content": "How many live in oslo?"} and choice_token_ids(answer)
    assert t.tools[0]["function"]["name"] == "lookup" and t.reward == 2.0

    # sync `invoke` in sync nodes of two concurrent rollouts: each records its own call
    a, b = await asyncio.gather(*(wrap_rollout(model, sync_node_rollout)(model, city) for city in ("rome", "oslo")))
    assert [t.messages_and_choices[0]["content"] for t in (a, b)] == ["Weather in rome?", "Weather in oslo?"]
    assert all(len(t.choices()) == 1 and choice_token_ids(t.choices()[0]) for t in (a, b))

    with pytest.raises(GroupwiseError, match="wrap_rollout"):
        init_chat_model()

    async def sync_rollout(model):
        init_chat_model().invoke("hi")

    async def elsewhere_rollout(model):
        init_chat_model(base_url="http://elsewhere/v1")

    with pytest.raises(Exception) as info:  # on the loop: refused, not a hang
        await wrap_rollout(model, sync_rollout)(model)
    # older openai SDKs wrap a transport's error in APIConnectionError; then it is the cause
    error = info.value
    while not isinstance(error, GroupwiseError) and error.__cause__ is not None:
        error = error.__cause__
    assert isinstance(error, GroupwiseError) and "would wait for itself" in str(error)
    with pytest.raises(GroupwiseError, match="base_url"):
        await wrap_rollout(model, elsewhere_rollout)(model)

    async def not_a_trajectory(model):
        await init_chat_model(max_tokens=2).ainvoke("hi")
        return {"reward": 1.0}

    with pytest.raises(GroupwiseError, match="must return a groupwise Trajectory"):
        await wrap_rollout(model, not_a_trajectory)(model)
    await backend.close()


async def test_arts_llm_wrapper_pieces_called_by_hand(tiny_model_dir, tmp_path):
    # programs that do wrap_rollout's work themselves: add_thread before building the model, the agent,
    # then create_messages_from_logs; LoggingLLM wrapping the chat model (ART's class of it)
    import uuid

    from groupwise.langgraph.llm_wrapper import LoggingLLM, add_thread, create_messages_from_logs

    model = art.TrainableModel(name="agent", project="langgraph", base_model=tiny_model_dir)
    backend = LocalBackend(path=str(tmp_path))
    await model.register(backend)
    try:
        async def by_hand(city: str, seed: int) -> art.Trajectory:
            log_path = add_thread(str(uuid.uuid4()), model.inference_base_url, model.inference_api_key,
                                  model.inference_model_name)
            llm = LoggingLLM(init_chat_model(temperature=1.0, seed=seed), logger=None)
            await build_agent(llm).ainvoke({"messages": [SystemMessage("Answer with the population of the city."),
                                                         HumanMessage(f"How many live in {city}?")]},
                                           config={"recursion_limit": 8})
            return create_messages_from_logs(log_path, art.Trajectory(reward=1.0))

        first, second = await asyncio.gather(by_hand("paris", 1), by_hand("oslo", 2))  # concurrent threads stay apart
        assert check_trajectory(first) > 0 and check_trajectory(second) > 0
        assert first.messages_and_choices[1] != second.messages_and_choices[1]
        with pytest.raises(GroupwiseError, match="each thread's calls are read once"):
            create_messages_from_logs(".art/langgraph/unknown", art.Trajectory())
    finally:
        await backend.close()
