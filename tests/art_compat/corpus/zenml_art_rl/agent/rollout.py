# Restated from zenml-io/zenml-projects, art-rl/agent/rollout.py (corpus/README.md): a LangGraph ReAct
# email agent through ART's init_chat_model, its final answer judged. Every use of ART is kept.
import uuid
from typing import Optional

import art
from langchain_core.messages import HumanMessage, SystemMessage
from langgraph.prebuilt import create_react_agent

from agent.judge import judge_correctness
from environment.models import EmailScenario, FinalAnswer
from environment.tools import create_email_tools

MAX_TURNS = 20


class ProjectTrajectory(art.Trajectory):
    final_answer: Optional[FinalAnswer] = None


async def rollout(model: art.Model, email_scenario: EmailScenario, db_path: str = "./enron_emails.db",
                  judge_model: str = "openai/gpt-4.1") -> ProjectTrajectory:
    from art.langgraph import init_chat_model

    scenario = email_scenario.scenario
    traj = ProjectTrajectory(reward=0.0, messages_and_choices=[],
                             metadata={"scenario_id": scenario.id, "step": email_scenario.step})
    final_answer_container: dict = {"value": None}
    tools = create_email_tools(scenario=scenario, db_path=db_path,
                               on_final_answer=lambda a: final_answer_container.__setitem__("value", a))
    react_agent = create_react_agent(init_chat_model(model.name, temperature=1.0), tools)
    try:
        await react_agent.ainvoke(
            {"messages": [SystemMessage(content=f"You are an email search agent for {scenario.inbox_address}."),
                          HumanMessage(content=scenario.question)]},
            config={"configurable": {"thread_id": str(uuid.uuid4())}, "recursion_limit": MAX_TURNS})
        if final_answer_container["value"]:
            traj.final_answer = final_answer_container["value"]
            correctness = await judge_correctness(scenario, traj.final_answer.answer, judge_model=judge_model)
            traj.metrics["correct"] = float(correctness.accept)
    except Exception as e:
        print(f"Error running LangGraph agent: {e}")
        traj.messages_and_choices.append({"role": "assistant", "content": f"Error: {str(e)}"})
    return traj
