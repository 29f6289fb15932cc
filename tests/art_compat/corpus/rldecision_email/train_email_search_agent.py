# Third-party ART program, restated for groupwise's tests (corpus/README.md says how and why):
# johnson7788/RLDecisionAgent, backend/ART_Search_Email/train_email_search_agent.py, run as
# `train --max-steps 0 ...`. An email search agent over SQLite FTS5 built from a Hugging Face data set;
# its turns go through LiteLLM (`hosted_vllm/<model>` at the model's base URL) and are converted with
# art.utils.litellm.convert_litellm_choice_to_openai; tools are LangChain-converted functions; RULER
# with a hosted judge; _internal_config set after construction; LocalBackend(in_process=True,
# path="./.art"). Every use of ART is kept call for call; the SQL and prompts are shortened.
import argparse
import asyncio
import json
import os
import random
import sqlite3
from dataclasses import asdict, dataclass
from typing import List, Literal, Optional

import weave
from datasets import load_dataset
from dotenv import load_dotenv
from langchain_core.utils.function_calling import convert_to_openai_tool
from litellm import acompletion
from pydantic import BaseModel, Field

import art
from art.local import LocalBackend
from art.rewards import ruler_score_group
from art.utils.litellm import convert_litellm_choice_to_openai

MAX_TURNS = 10
DB_PATH = "./enron_emails.db"
_db_conn = None


class Scenario(BaseModel):
    id: int
    question: str
    answer: str
    message_ids: List[str]
    how_realistic: float
    inbox_address: str
    query_date: str
    split: Literal["train", "test"]


@dataclass
class SearchResult:
    message_id: str
    snippet: str


class FinalAnswer(BaseModel):
    answer: str
    source_ids: list[str]


def create_email_database() -> sqlite3.Connection:
    conn = sqlite3.connect(DB_PATH, check_same_thread=False)
    conn.executescript("""
        CREATE TABLE emails (id INTEGER PRIMARY KEY AUTOINCREMENT, message_id TEXT UNIQUE, subject TEXT,
                             from_address TEXT, date TEXT, body TEXT);
        CREATE TABLE recipients (email_id TEXT, recipient_address TEXT, recipient_type TEXT);
        CREATE VIRTUAL TABLE emails_fts USING fts5(subject, body, content='emails', content_rowid='id');
    """)
    for email in load_dataset("corbt/enron-emails", split="train"):
        conn.execute("INSERT INTO emails (message_id, subject, from_address, date, body) VALUES (?, ?, ?, ?, ?)",
                     (email["message_id"], email["subject"], email["from"], email["date"].strftime("%Y-%m-%d %H:%M:%S"),
                      email["body"]))
        conn.executemany("INSERT INTO recipients VALUES (?, ?, 'to')", [(email["message_id"], a) for a in email["to"]])
    conn.execute("INSERT INTO emails_fts(emails_fts) VALUES('rebuild')")
    conn.commit()
    return conn


def get_db_connection() -> sqlite3.Connection:
    global _db_conn
    if _db_conn is None:
        _db_conn = sqlite3.connect(DB_PATH, check_same_thread=False) if os.path.exists(DB_PATH) else create_email_database()
    return _db_conn


def search_emails(inbox: str, keywords: List[str], sent_before: Optional[str] = None, max_results: int = 10) -> List[SearchResult]:
    if not keywords:
        raise ValueError("No keywords provided for search.")
    rows = get_db_connection().execute(
        """SELECT e.message_id, snippet(emails_fts, -1, '<b>', '</b>', ' ... ', 15) FROM emails e
           JOIN emails_fts fts ON e.id = fts.rowid WHERE fts.emails_fts MATCH ? AND (e.from_address = ? OR EXISTS
           (SELECT 1 FROM recipients r WHERE r.recipient_address = ? AND r.email_id = e.message_id))
           AND e.date < ? ORDER BY e.date DESC LIMIT ?""",
        (" ".join(f'"{k}"' for k in keywords), inbox, inbox, f"{sent_before} 00:00:00", max_results)).fetchall()
    return [SearchResult(message_id=r[0], snippet=r[1]) for r in rows]


def read_email(message_id: str) -> Optional[dict]:
    row = get_db_connection().execute("SELECT subject, body FROM emails WHERE message_id = ?", (message_id,)).fetchone()
    return {"subject": row[0], "body": row[1]} if row else None


def load_training_scenarios(split="train", limit=None, max_messages=1, shuffle=False, seed=None) -> List[Scenario]:
    dataset = load_dataset("corbt/enron_emails_sample_questions", split=split)
    scenarios = [Scenario(**row, split=split) for row in dataset if len(row["message_ids"]) <= max_messages]
    if shuffle:
        random.Random(seed).shuffle(scenarios)
    return scenarios[:limit] if limit is not None else scenarios


class CorrectnessJudgeResponse(BaseModel):
    reasoning: str = Field(description="Why accepted or rejected")
    accept: bool = Field(description="Accept this AI answer?")


async def judge_correctness(scenario: Scenario, answer: str) -> CorrectnessJudgeResponse:
    resp = await acompletion(model="openai/o4-mini", messages=[
        {"role": "system", "content": "Accept the AI answer only if it contains the reference answer."},
        {"role": "user", "content": f"Question: {scenario.question}\nReference answer: {scenario.answer}\nAI answer: {answer}"}],
        response_format=CorrectnessJudgeResponse)
    raw = resp.choices[0].message.content or "{}"
    try:
        return CorrectnessJudgeResponse.model_validate_json(raw)
    except Exception as e:
        return CorrectnessJudgeResponse(reasoning=f"Parse error: {e}", accept=False)


class ProjectTrajectory(art.Trajectory):
    final_answer: FinalAnswer | None = None


class EmailScenario(BaseModel):
    step: int
    scenario: Scenario


@weave.op
async def rollout(model: art.Model, email_scenario: EmailScenario) -> ProjectTrajectory:
    scenario = email_scenario.scenario
    traj = ProjectTrajectory(reward=0.0, messages_and_choices=[],
                             metadata={"scenario_id": scenario.id, "step": email_scenario.step})
    traj.messages_and_choices = [
        {"role": "system", "content": f"You are an email search agent for {scenario.inbox_address}; today is {scenario.query_date}."},
        {"role": "user", "content": scenario.question},
    ]

    def search_inbox(keywords: list[str]) -> list[dict]:
        """Search the inbox for emails matching the keywords."""
        return [asdict(r) for r in search_emails(inbox=scenario.inbox_address, keywords=keywords,
                                                 sent_before=scenario.query_date)]

    def return_final_answer(answer: str, reference_message_ids: list[str]) -> FinalAnswer:
        """Return the final answer and the message ids it cites."""
        return FinalAnswer(answer=answer, source_ids=reference_message_ids)

    tools = [search_inbox, read_email, return_final_answer]
    tools_by_name = {t.__name__: t for t in tools}
    traj.tools = [convert_to_openai_tool(t) for t in tools]
    litellm_model_name = f"hosted_vllm/{model.name}" if model.trainable else model.name
    for _ in range(MAX_TURNS):
        resp = await acompletion(model=litellm_model_name, base_url=model.inference_base_url,
                                 api_key=model.inference_api_key, temperature=1, messages=traj.messages(),
                                 caching=False, tools=traj.tools, max_tokens=32)
        choice = resp.choices[0]
        msg = choice.message
        traj.messages_and_choices.append(convert_litellm_choice_to_openai(choice))
        if not getattr(msg, "tool_calls", None):
            return traj
        try:
            for tc in msg.tool_calls:
                name = tc.function.name
                if name in tools_by_name:
                    result = tools_by_name[name](**json.loads(tc.function.arguments))
                    traj.messages_and_choices.append({"role": "tool", "tool_call_id": tc.id, "name": name,
                                                      "content": str(result)})
                    if name == "return_final_answer":
                        traj.final_answer = result
                        judge = await judge_correctness(scenario, traj.final_answer.answer)
                        traj.metrics["correct"] = float(judge.accept)
                        return traj
        except Exception as e:
            print(f"Error parsing tool calls: {e}")
            return traj
    return traj


async def setup_model_and_backend(seed: int = 42) -> art.TrainableModel:
    random.seed(seed)
    model = art.TrainableModel(name="email-agent-001", project="email-search-agent",
                               base_model="Qwen/Qwen2.5-7B-Instruct")
    model._internal_config = art.dev.InternalModelConfig(
        init_args=art.dev.InitArgs(max_seq_length=8192),
        engine_args=art.dev.EngineArgs(enforce_eager=True, gpu_memory_utilization=0.8),
    )
    backend = LocalBackend(in_process=True, path="./.art")
    await model.register(backend)
    return model


async def run_training(max_steps=20, groups_per_step=2, rollouts_per_group=4, num_epochs=20, learning_rate=1e-5):
    model = await setup_model_and_backend()
    train_scenarios = load_training_scenarios(split="train", limit=50, max_messages=1, shuffle=True, seed=42)
    from art.utils import iterate_dataset

    it = iterate_dataset(train_scenarios, groups_per_step=groups_per_step, num_epochs=num_epochs,
                         initial_step=await model.get_step())
    for batch in it:
        groups = [art.TrajectoryGroup((rollout(model, EmailScenario(step=batch.step, scenario=scenario))
                                       for _ in range(rollouts_per_group))) for scenario in batch.items]
        finished = await art.gather_trajectory_groups(groups, pbar_desc="gather",
                                                      max_exceptions=rollouts_per_group * len(batch.items))
        judged_groups = []
        for g in finished:
            judged_groups.append(await ruler_score_group(g, "openai/o4-mini", debug=True))
        await model.delete_checkpoints()
        await model.train(judged_groups, config=art.TrainConfig(learning_rate=learning_rate),
                          _config={"logprob_calculation_chunk_size": 8})
        if batch.step >= max_steps:
            break


def main():
    parser = argparse.ArgumentParser(description="Train the ART email search agent.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build-db")
    p_train = sub.add_parser("train")
    p_train.add_argument("--max-steps", type=int, default=20)
    p_train.add_argument("--groups-per-step", type=int, default=2)
    p_train.add_argument("--rollouts-per-group", type=int, default=4)
    p_train.add_argument("--num-epochs", type=int, default=20)
    p_train.add_argument("--lr", type=float, default=1e-5)
    args = parser.parse_args()
    load_dotenv()
    if not os.environ.get("OPENAI_API_KEY"):
        raise ValueError("OPENAI_API_KEY is required for RULER/judge (e.g., openai/o4-mini).")
    if args.cmd == "build-db":
        create_email_database()
        return
    asyncio.run(run_training(max_steps=args.max_steps, groups_per_step=args.groups_per_step,
                             rollouts_per_group=args.rollouts_per_group, num_epochs=args.num_epochs,
                             learning_rate=args.lr))


if __name__ == "__main__":
    main()
