# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# johnson7788/RLDecisionAgent, backend/ART_Langgraph_multi/train.py. A LangGraph planner and a ReAct
# researcher write slides with a web search tool; RULER scores each group with a judge on
# localhost:6688 (extra_litellm_params), blended with the rollout's own structure score; W&B logs.
# Every use of ART is kept call for call; prompts, data and the search are shortened.
import asyncio
import json
import os
import re
import time
import uuid
from statistics import mean
from typing import List, Optional

import art
import wandb
from art.langgraph import init_chat_model, wrap_rollout
from art.utils import iterate_dataset
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from litellm import acompletion
from pydantic import BaseModel, Field
from zai import ZhipuAiClient

NAME = os.getenv("ART_NAME", "web-search")
MODEL_NAME = os.getenv("ART_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
PROJECT_NAME = os.getenv("ART_PROJECT", "web-search-agent-training")
RULER_MODEL = os.getenv("RULER_MODEL", "openai/o4-mini")
ALPHA_RULER = 0.7
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


class CorrectnessJudgeResponse(BaseModel):
    reasoning: str = Field(description="why")
    accept: bool = Field(description="accept or not")


async def search_web(keyword: str) -> List[dict]:
    response = WebSearchClient.web_search.web_search(search_engine="search_std", search_query=keyword, count=4)
    return [{"url": r["url"], "title": r["title"], "snippet": r["content"]} for r in response["search_result"]]


async def judge_correctness(s: Scenario, answer: str) -> CorrectnessJudgeResponse:
    resp = await acompletion(
        model="openai/gpt-4o-mini", base_url="http://127.0.0.1:6688",
        messages=[{"role": "system", "content": "Judge whether the AI answer matches the reference."},
                  {"role": "user", "content": f"Q: {s.question}\nRef: {s.answer}\nAI: {answer}"}],
        response_format=CorrectnessJudgeResponse,
    )
    return CorrectnessJudgeResponse.model_validate_json(resp.choices[0].message.content or "{}")


async def rollout(model: art.Model, web_search_scenario: WebSearchScenario) -> ProjectTrajectory:
    scenario = web_search_scenario.scenario
    traj = ProjectTrajectory(reward=0.0, messages_and_choices=[],
                             metadata={"scenario_id": scenario.id, "step": web_search_scenario.step})
    planner_model = init_chat_model(MODEL_NAME, temperature=0.2)
    plan_msg = await planner_model.ainvoke([
        SystemMessage(content="Output a STRICT JSON array of slides: {id, title, queries}."),
        HumanMessage(content=f"Presentation title: {scenario.question}")])
    plan_text = (getattr(plan_msg, "content", None) or "").strip()
    try:
        plan = json.loads(plan_text)
    except Exception:
        m = re.search(r"\[.*\]", plan_text, flags=re.S)
        plan = []
        if m:
            try:
                plan = json.loads(m.group(0))
            except Exception:
                plan = []
    if not isinstance(plan, list) or not plan:
        plan = [{"id": 1, "title": scenario.question, "queries": [scenario.question]}]

    slides: List[dict] = []

    @tool
    async def web_search_tool(query: str) -> List[dict]:
        """Search the web by a query and return a list of results."""
        return await search_web(query)

    @tool
    def return_slide_tool(title: str, bullets: List[str], source_urls: List[str]) -> dict:
        """Return one slide's content."""
        slides.append({"title": title, "bullets": bullets, "source_urls": source_urls})
        return slides[-1]

    researcher_agent = create_react_agent(init_chat_model(MODEL_NAME, temperature=0.7),
                                          [web_search_tool, return_slide_tool])
    for item in plan[:2]:
        await researcher_agent.ainvoke(
            {"messages": [SystemMessage(content="You are the Research & Write agent."),
                          HumanMessage(content=f"Slide: {item.get('title', '') if isinstance(item, dict) else item}")]},
            config={"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": 6},
        )
    final_msg = await init_chat_model(MODEL_NAME, temperature=0.0).ainvoke(
        [SystemMessage(content="Summarize the slides into ONE short answer."),
         HumanMessage(content=f"Question: {scenario.question}")])
    traj.final_answer = FinalAnswer(answer=(getattr(final_msg, "content", None) or "").strip(),
                                    source_urls=[u for s in slides for u in s["source_urls"]])
    structure = len(slides) / max(1, len(plan))
    traj.reward = structure
    traj.metrics["structure_score"] = structure
    try:
        judge = await judge_correctness(scenario, traj.final_answer.answer)
        traj.metrics["correct"] = float(judge.accept)
    except Exception:
        pass
    return traj


def _log_batch_to_wandb(*, batch, finished_groups):
    trajectories = [t for g in finished_groups for t in g.trajectories]
    table = wandb.Table(columns=["scenario_id", "final_answer"])
    for t in trajectories[:50]:
        table.add_data((t.metadata or {}).get("scenario_id", ""), t.final_answer.answer if t.final_answer else "")
    wandb.log({"train/step": batch.step, "train/epoch": batch.epoch, "data/num_trajectories": len(trajectories),
               "reward/structure_mean": mean(t.metrics.get("structure_score", 0.0) for t in trajectories),
               "samples/rollouts": table}, step=batch.step)


def blend_rewards_inplace(orig_groups, judged_groups, alpha: float):
    for og, jg in zip(orig_groups, judged_groups):
        try:
            for ot, jt in zip(og.trajectories, jg.trajectories):
                jt.reward = alpha * float(jt.reward or 0.0) + (1.0 - alpha) * float(ot.reward or 0.0)
        except Exception:
            continue


async def main():
    wandb.init(project=os.getenv("WANDB_PROJECT", PROJECT_NAME), entity=os.getenv("WANDB_ENTITY") or None,
               name=f"{NAME}-{time.strftime('%Y%m%d-%H%M%S')}",
               config={"art_project": PROJECT_NAME, "art_name": NAME, "base_model": MODEL_NAME})
    wandb.define_metric("*", step_metric="train/step")
    from art.local.backend import LocalBackend
    backend = LocalBackend()
    model = art.TrainableModel(name=NAME, project=PROJECT_NAME, base_model=MODEL_NAME)
    await model.register(backend)
    training_scenarios = [
        Scenario(id="p1", question="Planner and researcher roles in a slide agent", answer="Decoupling helps."),
        Scenario(id="p2", question="From outline to deck: a retrieval workflow", answer="Outline, cite, write."),
    ]
    training_config = {"groups_per_step": 2, "num_epochs": 2, "rollouts_per_group": 4, "learning_rate": 1e-5,
                       "max_steps": 5}
    wandb.config.update(training_config)
    it = iterate_dataset(training_scenarios, groups_per_step=training_config["groups_per_step"],
                         num_epochs=training_config["num_epochs"], initial_step=await model.get_step())
    from art.rewards import ruler_score_group

    for batch in it:
        groups = [art.TrajectoryGroup(wrap_rollout(model, rollout)(model, WebSearchScenario(step=batch.step, scenario=s))
                                      for _ in range(training_config["rollouts_per_group"]))
                  for s in batch.items]
        finished = await art.gather_trajectory_groups(
            groups, pbar_desc="gather", max_exceptions=training_config["rollouts_per_group"] * len(batch.items))
        _log_batch_to_wandb(batch=batch, finished_groups=finished)
        extra_litellm_params = {"api_base": "http://localhost:6688", "api_key": os.environ.get("OPENAI_API_KEY", "")}
        judged = []
        for g in finished:
            judged.append(await ruler_score_group(g, RULER_MODEL, extra_litellm_params=extra_litellm_params, debug=True))
        blend_rewards_inplace(finished, judged, ALPHA_RULER)
        await model.train(judged, config=art.TrainConfig(learning_rate=training_config["learning_rate"]),
                          _config={"logprob_calculation_chunk_size": 8})
        wandb.log({"train/used_judged_groups": 1, "reward/alpha_ruler": ALPHA_RULER}, step=batch.step)
        if batch.step >= training_config["max_steps"]:
            break
    wandb.finish()


if __name__ == "__main__":
    asyncio.run(main())
