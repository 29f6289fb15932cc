"""The email agent (ART-E-like): answer a question about the user's inbox by searching and reading it.

Each turn the model calls one of three tools (tools.py); the episode ends when it calls
`return_final_answer`, replies without a tool call, or reaches `max_turns`.

Two ways to call tools (`tool_mode`):
- "native" (default): OpenAI tools (`tools=` in the request, `message.tool_calls` back, `role: tool`
  results), with ``tool_choice="required"`` by default. groupwise's server then decodes every reply
  under a grammar that only admits one schema-valid tool call (inference/constrained.py), and renders
  tools into the prompt itself for templates without tool support (SmolLM2's). Why required: base
  SmolLM2-135M wrote a parseable tool call in 0 of 32 replies when free (measured with the text
  prompt below), so without the grammar every episode is a format error and there is nothing to
  learn; with it, the signal is which tool, which keywords, which answer. The logprobs the server
  reports stay those of the unconstrained policy, which is what the trainer needs. On the last turn
  `force_final_answer` names `return_final_answer` (measured: left free, base SmolLM2 searched until
  the turn limit in 6 of 6 episodes, so every episode scored the same 0).
- "text": the tools are described in the system prompt and called in the reply as
  ``<tool_call>{"name": "read_email", "arguments": {"message_id": "m0-1a2b3c"}}</tool_call>``; results
  come back as user messages. Plain chat, for servers without tools or tool_choice.
  In native mode a reply with no `tool_calls` is also read this way (many models print tool calls).

Rewards (the verifiable part; the loop may add or replace it with RULER, gated by `metrics["correct"]`):

| outcome                                              | reward |
|------------------------------------------------------|--------|
| correct answer                                       | 1 + 0.1 if the source is cited + 0.1 x unused-turn fraction |
| "I don't know", or turn limit reached with no answer | 0 + partial |
| wrong answer                                         | -1 + partial |
| a reply with no tool call (format error)             | -2 + partial |

partial = 0.1 if a search returned the source email + 0.1 if the agent read it (so the tiers never mix).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from groupwise.chat.tool_calls import read_tool_call, tool_call_blocks
from groupwise.envs._chat import Sampling, choice_text, complete, new_trajectory, sendable_text, turn_sampling
from groupwise.envs.email_search import tools as T
from groupwise.envs.email_search.inbox import default_database, generate_corpus
from groupwise.envs.email_search.questions import (
    Question,
    is_correct,
    is_idk,
    questions_from_corpus,
    split_questions,
)
from groupwise.core.trajectory import Choice, Trajectory

SYSTEM_PROMPT = (
    "You are an email assistant for {inbox}. Today is {today}. Answer the user's question using their "
    "inbox: search it, read the emails that look relevant, then give a short final answer with the "
    "message_ids it comes from. You have at most {max_turns} turns."
)
TEXT_TOOLS = (
    "\n\nCall exactly one tool per reply, like this:\n"
    '<tool_call>{{"name": "search_emails", "arguments": {{"keywords": ["flight", "Denver"]}}}}</tool_call>\n'
    "Tools:\n"
    "- search_emails(keywords: list of words, from_addr, to_addr, sent_after: YYYY-MM-DD, sent_before: "
    "YYYY-MM-DD, max_results: at most 10): emails containing all keywords (only keywords is required).\n"
    "- read_email(message_id): the full email.\n"
    "- return_final_answer(answer, sources: list of message_ids): your final answer; ends the task."
)

class ScenarioEmail(Sampling):
    question_id: str
    inbox: str = Field(description="The inbox owner's address; the tools only see this inbox.")
    question: str
    answer: str = Field(description="Ground truth (never shown to the model).")
    source_id: str = Field(description="message_id of the email holding the answer.")
    keywords: tuple[str, ...] = Field((), description="Ground truth: the question's words that find the source "
                                      "(never shown to the model; the scripted demonstrations search with them).")
    today: str
    max_turns: int = Field(4, gt=0, description="Most model replies (tool calls) per episode.")
    tool_mode: Literal["text", "native"] = Field("native", description="How tools are called (module doc).")
    tool_choice: Literal["required", "auto"] | None = Field(
        "required", description="Native mode: 'required' forces one tool call per reply (module doc); "
        "'auto' lets the model answer in text; None leaves it out of the request.")
    force_final_answer: bool = Field(
        True, description="Native mode: on the last turn, tool_choice names return_final_answer, so every "
        "episode ends with an answer (graded right/wrong/I don't know) instead of running out of turns.")
    db: str | None = Field(None, description="SQLite corpus path; None builds/uses the default cache.")
    corpus_seed: int = Field(0, description="Seed of the default corpus (when db is None).")
    max_tokens: int = Field(96, gt=0, description="Most tokens per reply; a tool call is ~30-50 tokens.")


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] | None
    call_id: str | None = None  # set for native calls: the result must name it
    error: str | None = None


def _call_from_json(raw: str) -> ToolCall:
    """One call's JSON, read as the server reads a tool call (the chat layer's `read_tool_call`), and
    stricter on one point: this env's tools take keyword arguments, so arguments must be an object."""
    name, args, error = read_tool_call(raw)
    if error is not None:
        return ToolCall("?", None, error=f"{error}.")
    if not isinstance(args, dict):
        return ToolCall(str(name), None, error="arguments must be a JSON object.")
    return ToolCall(str(name), args)


def parse_text_tool_calls(text: str) -> list[ToolCall]:
    """Tool calls written in a reply: ``<tool_call>{json}</tool_call>`` blocks as the server finds them
    (the chat layer's `tool_call_blocks`; an unclosed last one too), else a reply that is one bare JSON
    object with a "name" (a small model often drops the tags). Only the first call is returned: one tool
    per reply."""
    text = text or ""
    blocks = tool_call_blocks(text)
    if blocks:
        return [_call_from_json(blocks[0])]
    stripped = text.strip()
    if stripped.startswith("{") and '"name"' in stripped:
        return [_call_from_json(stripped)]
    return []


def parse_tool_calls(choice: Choice) -> list[ToolCall]:
    native = choice.message.tool_calls or []
    if native:
        out = []
        for tc in native:
            call = _call_from_json(json.dumps({"name": tc.function.name, "arguments": tc.function.arguments or "{}"}))
            call.call_id = tc.id
            out.append(call)
        return out
    return parse_text_tool_calls(choice_text(choice))


def email_reward(*, correct: bool, answered: bool, idk: bool, format_error: bool, found_source: bool,
                 read_source: bool, cited_source: bool, turns: int, max_turns: int) -> float:
    """The tiered reward of the module docstring."""
    partial = 0.1 * found_source + 0.1 * read_source
    if correct:
        return 1.0 + 0.1 * cited_source + 0.1 * (1 - turns / max_turns)
    if format_error:
        return -2.0 + partial
    if answered and not idk:
        return -1.0 + partial
    return 0.0 + partial


def run_tool(call: ToolCall, db: str, scenario: ScenarioEmail) -> Any:
    fn = {"search_emails": T.search_emails, "read_email": T.read_email}.get(call.name)
    if fn is None:
        raise T.ToolError(f"unknown tool {call.name!r}; the tools are {list(T.TOOL_NAMES)}.")
    try:
        return fn(db, scenario.inbox, **(call.arguments or {}))
    except TypeError as exc:  # wrong or missing argument names
        raise T.ToolError(f"bad arguments for {call.name}: {exc}") from None


async def rollout(model: Any, scenario: ScenarioEmail) -> Trajectory:
    db = scenario.db or str(default_database(scenario.corpus_seed))
    native = scenario.tool_mode == "native"
    system = SYSTEM_PROMPT.format(inbox=scenario.inbox, today=scenario.today, max_turns=scenario.max_turns)
    traj = new_trajectory(system + ("" if native else TEXT_TOOLS), scenario.question, tools=T.TOOLS if native else None)
    traj.metadata.update({"env": "email", "question_id": scenario.question_id, "inbox": scenario.inbox,
                          "question": scenario.question, "truth": scenario.answer, "source_id": scenario.source_id})
    final: dict[str, Any] | None = None
    format_error = found = read = False
    tool_errors = turns = 0
    while turns < scenario.max_turns and final is None:
        tool_choice: Any = scenario.tool_choice if native else None
        if native and scenario.force_final_answer and turns == scenario.max_turns - 1:
            tool_choice = {"type": "function", "function": {"name": "return_final_answer"}}
        choice = await complete(model, traj.messages(), turn_sampling(scenario, turns),
                                tools=T.TOOLS if native else None, tool_choice=tool_choice)
        traj.messages_and_choices.append(choice)
        turns += 1
        calls = parse_tool_calls(choice)
        if not calls:
            format_error = True
            traj.log(f"turn {turns}: no tool call in {choice_text(choice)[:100]!r}")
            break
        for call in calls:
            try:
                if call.error:
                    raise T.ToolError(call.error)
                if call.name == "return_final_answer":
                    final = T.return_final_answer(**(call.arguments or {}))
                    result: Any = {"ok": True}
                else:
                    result = run_tool(call, db, scenario)
            except (T.ToolError, TypeError) as exc:
                tool_errors += 1
                result = {"error": str(exc)}
                traj.log(f"turn {turns}: tool error: {exc}")
            if call.name == "search_emails" and isinstance(result, list):
                found = found or any(r["message_id"] == scenario.source_id for r in result)
            if call.name == "read_email" and isinstance(result, dict):
                read = read or result.get("message_id") == scenario.source_id
            # sendable: an error message may quote the model's argument, lone surrogates and all
            content = sendable_text(json.dumps(result, ensure_ascii=False))
            if call.call_id is not None:
                traj.messages_and_choices.append({"role": "tool", "tool_call_id": call.call_id, "content": content})
            elif final is None:
                traj.messages_and_choices.append({"role": "user", "content": f"<tool_result>{content}</tool_result>"})
            if final is not None:
                break
    answer = final["answer"] if final else ""
    answered = final is not None
    idk = answered and is_idk(answer)
    correct = answered and not idk and is_correct(answer, scenario.answer)
    cited = answered and scenario.source_id in final["sources"]
    traj.reward = email_reward(correct=correct, answered=answered, idk=idk, format_error=format_error,
                               found_source=found, read_source=read, cited_source=cited, turns=turns,
                               max_turns=scenario.max_turns)
    traj.metadata["answer"] = answer
    traj.metrics.update({
        "correct": float(correct), "answered": float(answered), "idk": float(idk),
        "format_error": float(format_error), "tool_errors": tool_errors, "turns": turns,
        "found_source": float(found), "read_source": float(read), "cited_source": float(cited),
    })
    return traj.finish()


def validate(trajectory: Trajectory) -> float:
    """Held-out metric: exact-answer accuracy (1 when the normalised answer matches, else 0)."""
    return float(trajectory.metrics["correct"])


def _scenario(q: Question, **overrides: Any) -> ScenarioEmail:
    return ScenarioEmail(question_id=q.id, inbox=q.inbox, question=q.question, answer=q.answer,
                         source_id=q.source_id, keywords=q.keywords, today=q.today, **overrides)


def scenarios(seed: int = 0, *, corpus_seed: int = 0, db: str | Path | None = None, **overrides: Any):
    """(train, val, test) questions, split 80/10/10 by id; the run seed only shuffles the training order."""
    questions = questions_from_corpus(generate_corpus(corpus_seed))
    train, val, test = split_questions(questions)
    train = list(train)
    random.Random(f"email-train:{seed}").shuffle(train)
    common = {"corpus_seed": corpus_seed, "db": str(db) if db else None, **overrides}
    return (
        [_scenario(q, **common) for q in train],
        [_scenario(q, **{"sampling_seed": i, **common}) for i, q in enumerate(val)],
        [_scenario(q, **{"sampling_seed": i, **common}) for i, q in enumerate(test)],
    )
