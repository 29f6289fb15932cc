# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# johnson7788/RLDecisionAgent, backend/MCP_Agents/rl_train/train.py. A LangGraph ReAct agent fills a
# slide outline from web searches; its reward is the program's own (format and search), computed
# from the tool messages it reads back out of `traj.messages_and_choices`; W&B logs a table per step.
# Every use of ART is kept call for call; the outline and prompts are shortened.
import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass
from textwrap import dedent
from typing import Any, Dict, List, Optional

import art
import dotenv
import wandb
from art.langgraph import init_chat_model, wrap_rollout
from art.utils import iterate_dataset
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from pydantic import BaseModel, Field, ValidationError
from reward import format_reward, search_reward
from zai import ZhipuAiClient

dotenv.load_dotenv()
WebSearchClient = ZhipuAiClient(api_key=os.environ["ZHIPU_API_KEY"])
NAME = os.getenv("ART_NAME", "outline-webfill")
MODEL_NAME = os.getenv("ART_MODEL", "Qwen/Qwen2.5-0.5B-Instruct")
PROJECT_NAME = os.getenv("ART_PROJECT", "content-training")


class FinalFilledOutline(BaseModel):
    task: List[Dict[str, Any]]
    sources: List[str] = Field(default_factory=list)


@dataclass
class OutlineScenario:
    id: str
    prompt: str
    input_task: List[Dict[str, Any]]


class ProjectTrajectory(art.Trajectory):
    final: Optional[FinalFilledOutline] = None


train_data = [
    {"difficulty": 1, "task": [{"type": "cover", "data": {"title": "Market trends 2025", "text": "AI generated"}},
                               {"type": "content", "data": {"title": "AI adoption", "items": [{"title": "Diagnosis", "text": "..."}]}},
                               {"type": "end"}]},
    {"difficulty": 1, "task": [{"type": "cover", "data": {"title": "Launch event playbook", "text": "AI generated"}},
                               {"type": "content", "data": {"title": "Venue", "items": [{"title": "Transport", "text": "..."}]}},
                               {"type": "end"}]},
]


async def search_web(keyword: str) -> List[dict]:
    response = WebSearchClient.web_search.web_search(search_engine="search_std", search_query=keyword, count=4)
    return [{"url": r["url"], "title": r["title"], "snippet": r["content"]} for r in response["search_result"]]


async def rollout(model: art.Model, scenario: OutlineScenario) -> ProjectTrajectory:
    traj = ProjectTrajectory(reward=0.0, messages_and_choices=[], metadata={"scenario_id": scenario.id})

    @tool
    async def web_search_tool(query: str) -> List[dict]:
        """Search the web; returns [{url, title, snippet}, ...]."""
        return await search_web(query)

    final: Optional[FinalFilledOutline] = None

    @tool
    def return_filled_outline_tool(task: List[Dict[str, Any]], sources: List[str]) -> dict:
        """Return the filled outline (same structure) and its sources."""
        nonlocal final
        try:
            final = FinalFilledOutline(task=task, sources=sources or [])
            return final.model_dump()
        except ValidationError as e:
            return {"error": f"ValidationError: {e}"}

    agent = create_react_agent(init_chat_model(MODEL_NAME, temperature=0.8), [web_search_tool, return_filled_outline_tool])
    await agent.ainvoke(
        {"messages": [SystemMessage(content="Fill every text of the outline from web searches, citing [n]."),
                      HumanMessage(content=dedent(f"Outline:\n{json.dumps(scenario.input_task, ensure_ascii=False)}"))]},
        config={"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": 16},
    )
    if final:
        traj.final = final
        tool_urls_seen: List[str] = []
        try:
            for m in traj.messages_and_choices:
                if m.get("role") == "tool" and m.get("name") == "web_search_tool":
                    content = m.get("content")
                    content = json.loads(content) if isinstance(content, str) else content
                    tool_urls_seen += [rec.get("url") for rec in content or [] if isinstance(rec, dict)]
        except Exception:
            pass
        fr = format_reward(scenario.input_task, final.task)
        sr = search_reward(final.task, final.sources, tool_urls_seen=tool_urls_seen)
        traj.reward = 0.5 * fr + 0.5 * sr
        traj.metrics["format_reward"] = fr
        traj.metrics["search_reward"] = sr
    return traj


def _log_batch_to_wandb(*, batch, finished_groups):
    trajectories = [t for g in finished_groups for t in g.trajectories]
    table = wandb.Table(columns=["scenario_id", "format_reward", "search_reward", "total_reward"])
    for t in trajectories[:50]:
        table.add_data(t.metadata.get("scenario_id", ""), t.metrics.get("format_reward", 0.0),
                       t.metrics.get("search_reward", 0.0), t.reward)
    wandb.log({"train/step": batch.step, "train/epoch": batch.epoch, "samples/trajectories": table}, step=batch.step)


async def main():
    wandb.init(project=os.getenv("WANDB_PROJECT", PROJECT_NAME), entity=os.getenv("WANDB_ENTITY") or None,
               name=f"{NAME}-{time.strftime('%Y%m%d-%H%M%S')}",
               config={"art_project": PROJECT_NAME, "art_name": NAME, "base_model": MODEL_NAME})
    wandb.define_metric("*", step_metric="train/step")
    from art.local.backend import LocalBackend
    backend = LocalBackend()
    model = art.TrainableModel(name=NAME, project=PROJECT_NAME, base_model=MODEL_NAME)
    await model.register(backend)
    scenarios = [OutlineScenario(id=f"doc_{i}", prompt="Fill the outline.", input_task=row["task"])
                 for i, row in enumerate(train_data, start=1)]
    training_config = {"groups_per_step": 2, "num_epochs": int(os.environ.get("NUM_EPOCHS", "2")),
                       "rollouts_per_group": 3, "learning_rate": 1e-5, "max_steps": 6}
    wandb.config.update(training_config)
    it = iterate_dataset(scenarios, groups_per_step=training_config["groups_per_step"],
                         num_epochs=training_config["num_epochs"], initial_step=await model.get_step())
    for batch in it:
        groups = [art.TrajectoryGroup(wrap_rollout(model, rollout)(model, s)
                                      for _ in range(training_config["rollouts_per_group"])) for s in batch.items]
        finished = await art.gather_trajectory_groups(groups, pbar_desc="gather",
                                                      max_exceptions=training_config["rollouts_per_group"] * len(batch.items))
        _log_batch_to_wandb(batch=batch, finished_groups=finished)
        await model.train(finished, config=art.TrainConfig(learning_rate=training_config["learning_rate"]))
        if batch.step >= training_config["max_steps"]:
            break
    wandb.finish()


if __name__ == "__main__":
    asyncio.run(main())
