# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# johnson7788/RLDecisionAgent, backend/ART_Langgraph/train.py. A LangGraph web search agent trained
# with RULER (hosted o4-mini) — but the model it declares is a prompted `art.Model`, which has no
# `train`: the program stops at its first update, in ART as here. Every use of ART is kept call for
# call; prompts, data and the search are shortened.
import asyncio
import os
import uuid
from typing import List, Optional

import art
from art.langgraph import init_chat_model, wrap_rollout
from art.utils import iterate_dataset
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from pydantic import BaseModel
from zai import ZhipuAiClient

MODEL_NAME = os.getenv("ART_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
PROJECT_NAME = os.getenv("ART_PROJECT", "web-search-agent-training")
RULER_MODEL = os.getenv("RULER_MODEL", "openai/o4-mini")
WebSearchClient = ZhipuAiClient(api_key=os.environ["ZHIPU_API_KEY"])


class FinalAnswer(BaseModel):
    answer: str
    source_urls: List[str]


class Scenario(BaseModel):
    id: str
    question: str
    answer: str


class WebSearchScenario(BaseModel):
    step: int
    scenario: Scenario


class ProjectTrajectory(art.Trajectory):
    final_answer: Optional[FinalAnswer] = None


async def rollout(model: art.Model, web_search_scenario: WebSearchScenario) -> ProjectTrajectory:
    scenario = web_search_scenario.scenario
    traj = ProjectTrajectory(reward=0.0, messages_and_choices=[],
                             metadata={"scenario_id": scenario.id, "step": web_search_scenario.step})
    final_answer: Optional[FinalAnswer] = None

    @tool
    async def web_search_tool(query: str) -> List[dict]:
        """Search the web by a query and return a list of results."""
        response = WebSearchClient.web_search.web_search(search_engine="search_std", search_query=query, count=4)
        return [{"url": r["url"], "title": r["title"], "snippet": r["content"]} for r in response["search_result"]]

    @tool
    def return_final_answer_tool(answer: str, source_urls: List[str]) -> dict:
        """Return final answer with source URLs."""
        nonlocal final_answer
        final_answer = FinalAnswer(answer=answer, source_urls=source_urls)
        return final_answer.model_dump()

    agent = create_react_agent(init_chat_model(MODEL_NAME, temperature=1.0), [web_search_tool, return_final_answer_tool])
    await agent.ainvoke({"messages": [SystemMessage(content="You are a web search agent."),
                                      HumanMessage(content=scenario.question)]},
                        config={"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": 5})
    if final_answer:
        traj.final_answer = final_answer
    return traj


async def main():
    from art.local.backend import LocalBackend
    backend = LocalBackend()
    model = art.Model(name=MODEL_NAME, project=PROJECT_NAME)
    await model.register(backend)
    training_scenarios = [Scenario(id="1", question="Who is the CEO of OpenAI?", answer="Sam Altman"),
                          Scenario(id="2", question="What is the capital of France?", answer="Paris")]
    training_config = {"groups_per_step": 2, "num_epochs": 2, "rollouts_per_group": 4, "learning_rate": 1e-5,
                       "max_steps": 5}
    it = iterate_dataset(training_scenarios, groups_per_step=training_config["groups_per_step"],
                         num_epochs=training_config["num_epochs"], initial_step=await model.get_step())
    from art.rewards import ruler_score_group

    for batch in it:
        groups = [art.TrajectoryGroup(wrap_rollout(model, rollout)(model, WebSearchScenario(step=batch.step, scenario=s))
                                      for _ in range(training_config["rollouts_per_group"])) for s in batch.items]
        finished = await art.gather_trajectory_groups(
            groups, pbar_desc="gather", max_exceptions=training_config["rollouts_per_group"] * len(batch.items))
        judged = [await ruler_score_group(g, RULER_MODEL, debug=True) for g in finished]
        await model.train(judged, config=art.TrainConfig(learning_rate=training_config["learning_rate"]),
                          _config={"logprob_calculation_chunk_size": 8})
        if batch.step >= training_config["max_steps"]:
            break


if __name__ == "__main__":
    asyncio.run(main())
