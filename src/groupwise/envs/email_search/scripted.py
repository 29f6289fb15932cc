"""A scripted agent that knows the ground truth: the demonstrations of the email agent's SFT warm start.

No model is involved. For a question it does what a good agent does, through the env's own tools and
in the rollout's own message format (the scenario's tool mode: native tool calls and `tool` results,
or the text mode's ``<tool_call>`` replies and ``<tool_result>`` messages; the same system prompt and
tools), so a demonstration is exactly the trajectory `rollout` would record for a perfect policy:

1. ``search_emails(keywords=<the question's key words>)``: the words the question names the fact by
   (e.g. "flight" and the city), taken from the scenario's ground truth;
2. ``read_email(message_id=<the source email>)``;
3. ``return_final_answer(answer=<the ground-truth answer>, sources=[<the source email>])``.

Arguments are written in the order of the tool's JSON schema, the order the server's tool-call grammar
decodes them in, so the demonstrated tokens are ones the constrained policy can produce.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from groupwise.envs._chat import new_trajectory
from groupwise.envs.email_search import tools as T
from groupwise.envs.email_search.env import (
    SYSTEM_PROMPT,
    TEXT_TOOLS,
    ScenarioEmail,
    ToolCall,
    email_reward,
    run_tool,
)
from groupwise.envs.email_search.inbox import default_database
from groupwise.errors import ConfigError, EnvError
from groupwise.core.trajectory import Trajectory

__all__ = ["demonstration", "demonstrations"]


def _call(k: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": f"call_{k}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def demonstration(scenario: ScenarioEmail) -> Trajectory:
    """The trajectory of the scripted agent on `scenario` (in its tool mode), graded like a rollout."""
    native = scenario.tool_mode == "native"
    if scenario.max_turns < 3:
        raise ConfigError(f"a demonstration takes 3 turns (search, read, answer); max_turns={scenario.max_turns}",
                          what="scenario for a demonstration")
    if not scenario.keywords:
        raise ConfigError(f"scenario {scenario.question_id} has no keywords; build scenarios with `scenarios()`",
                          what="scenario for a demonstration")
    db = scenario.db or str(default_database(scenario.corpus_seed))
    system = SYSTEM_PROMPT.format(inbox=scenario.inbox, today=scenario.today, max_turns=scenario.max_turns)
    traj = new_trajectory(system + ("" if native else TEXT_TOOLS), scenario.question, tools=T.TOOLS if native else None)
    traj.metadata.update({"env": "email", "question_id": scenario.question_id, "inbox": scenario.inbox,
                          "question": scenario.question, "truth": scenario.answer, "source_id": scenario.source_id,
                          "policy": "scripted"})
    plan = [("search_emails", {"keywords": list(scenario.keywords)}),
            ("read_email", {"message_id": scenario.source_id}),
            ("return_final_answer", {"answer": scenario.answer, "sources": [scenario.source_id]})]
    found = read = False
    for k, (name, arguments) in enumerate(plan):
        call = _call(k, name, arguments)
        if native:
            traj.messages_and_choices.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:  # the text the TEXT_TOOLS prompt shows
            text = json.dumps({"name": name, "arguments": arguments})
            traj.messages_and_choices.append({"role": "assistant", "content": f"<tool_call>{text}</tool_call>"})
        if name == "return_final_answer":
            result: Any = {"ok": True}
        else:
            result = run_tool(ToolCall(name, arguments), db, scenario)
        if name == "search_emails":
            found = any(r["message_id"] == scenario.source_id for r in result)
            if not found:
                raise EnvError(f"searching {scenario.keywords} does not find {scenario.source_id}; the corpus "
                                   "no longer keeps each fact findable by its keywords")
        if name == "read_email":
            read = result["message_id"] == scenario.source_id
        content = json.dumps(result, ensure_ascii=False)
        if native:
            traj.messages_and_choices.append({"role": "tool", "tool_call_id": call["id"], "content": content})
        elif name != "return_final_answer":
            traj.messages_and_choices.append({"role": "user", "content": f"<tool_result>{content}</tool_result>"})
    traj.reward = email_reward(correct=True, answered=True, idk=False, format_error=False, found_source=found,
                               read_source=read, cited_source=True, turns=len(plan), max_turns=scenario.max_turns)
    traj.metadata["answer"] = scenario.answer
    traj.metrics.update({"correct": 1.0, "answered": 1.0, "idk": 0.0, "format_error": 0.0, "tool_errors": 0,
                         "turns": len(plan), "found_source": float(found), "read_source": float(read),
                         "cited_source": 1.0})
    return traj


def demonstrations(scenarios: Iterable[ScenarioEmail]) -> list[Trajectory]:
    """One demonstration per scenario (the training split's, for a warm start)."""
    return [demonstration(s) for s in scenarios]
