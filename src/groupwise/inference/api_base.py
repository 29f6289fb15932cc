"""What every request body model of the server shares (api_models.py: chat and completions;
api_responses.py: OpenAI's Responses; api_messages.py: Anthropic's Messages): strict fields, and the one
budget of JSON Schema nodes a request's schemas share.

Strict: unknown fields are refused (a typo the caller must hear about), numbers are numbers (no ``"5"``
for 5, no NaN or Infinity). Validate with ``model_validate_json(raw, context=limits_context())`` so that
all of a request's schemas share one budget of nodes (request_limits.py).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo

from groupwise.inference.request_limits import SchemaBudget

__all__ = ["Echoed", "Strict", "limits_context", "schema_budget"]


class Strict(BaseModel):
    """A request field's model: unknown keys refused, strict types, finite numbers."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Echoed(Strict):
    """An item an SDK sends back from an earlier answer: its own fields strict as `Strict`; the fields it
    may echo (ids, status, annotations) are declared by each item and accepted."""


def limits_context() -> dict[str, Any]:
    """The validation context of one request body: the node budget its schemas share."""
    return {"schema_budget": SchemaBudget()}


def schema_budget(info: ValidationInfo) -> SchemaBudget:
    """The request's shared node budget (a fresh one when validated without `limits_context`)."""
    context = info.context if isinstance(info.context, dict) else {}
    return context.get("schema_budget") or SchemaBudget()
