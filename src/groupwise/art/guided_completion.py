"""ART's teacher-guidance helpers at ART's path (``art.guided_completion``): from a teacher model's
completion, the request parameters that make a student sample the same answer (RL-based
distillation). A text answer becomes vLLM's ``guided_choice`` (one allowed answer), which groupwise's
server applies as a grammar; a tool call becomes a forced ``tool_choice`` with the tool's schema frozen
to the teacher's arguments. No torch here (client side).
"""

from __future__ import annotations

import json
from copy import deepcopy
from typing import Any, Iterable, Literal

from pydantic import create_model

from groupwise.errors import GroupwiseError

__all__ = ["freeze_tool_schema", "get_guided_completion_params"]


def freeze_tool_schema(tool: dict, fixed_args: dict) -> dict:
    """A copy of `tool` whose parameters schema allows only `fixed_args` (each field an enum of one)."""
    fields: dict[str, Any] = {k: (Literal[v], ...) for k, v in fixed_args.items()}  # type: ignore[valid-type]
    frozen = create_model(f"{tool['function']['name'].title()}FrozenArgs", **fields)
    locked = deepcopy(tool)
    locked["function"]["parameters"] = frozen.model_json_schema()
    return locked


def get_guided_completion_params(
    completion: Any, base_tools: Iterable[dict] | None = None,
) -> tuple[list[str] | None, dict | None, list[dict] | None]:
    """``(guided_choice, tool_choice, tools)`` that guide a student to the teacher's first choice:
    its text as the one allowed answer, or its first tool call forced with frozen arguments (then
    `base_tools`, the tools the teacher had, are required)."""
    message = completion.choices[0].message
    if message.tool_calls:
        call = message.tool_calls[0]
        if base_tools is None:
            raise GroupwiseError("the teacher's completion calls a tool: pass base_tools, the tools it was given")
        name = call.function.name
        chosen = next((t for t in base_tools if t["function"]["name"] == name), None)
        if chosen is None:
            raise GroupwiseError(f"the teacher called {name!r}, which is not among base_tools")
        return None, {"type": "function", "function": {"name": name}}, [
            freeze_tool_schema(chosen, json.loads(call.function.arguments))]
    return [message.content], None, None
