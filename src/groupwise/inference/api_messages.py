"""The body of Anthropic's Messages API (POST /v1/messages), as pydantic models: a bad field is a 400 naming
it (`groupwise.inference.api_models.describe_validation_error`), before any work is done.

Translated into a chat request by groupwise.chat.protocols; blocks are strict about their own fields,
and what an SDK echoes back from an earlier answer (ids, signatures, citations) is accepted. Apart from
the chat and completions bodies (api_models.py): a second protocol over the same engine.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from groupwise.inference.api_base import Echoed, Strict, schema_budget
from groupwise.inference.request_limits import MAX_MODEL_NAME_CHARS, MAX_TOOLS
from groupwise.inference.sampling import TOP_K_MAX

__all__ = ["AnthropicBlock", "AnthropicMessage", "AnthropicTool", "AnthropicToolChoice", "MessagesRequest"]


class AnthropicBlock(Echoed):
    type: Literal["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "document"]
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[AnthropicBlock] | None = None
    is_error: bool | None = None
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None
    source: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None

    @model_validator(mode="after")
    def _needs(self) -> "AnthropicBlock":
        wanted = {"text": ("text",), "tool_use": ("id", "name", "input"), "tool_result": ("tool_use_id",)}
        missing = [f for f in wanted.get(self.type, ()) if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.type} block needs {', '.join(missing)}")
        return self


class AnthropicMessage(Echoed):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicBlock]


class AnthropicTool(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        schema_budget(info).check(value, "input_schema")
        return value


class AnthropicToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> "AnthropicToolChoice":
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice names a tool exactly when its type is 'tool'")
        return self


class MessagesRequest(Strict):
    """An Anthropic Messages API request. ``metadata``, ``thinking`` (no effect: a chat template that thinks
    takes chat_template_kwargs on chat completions), ``service_tier`` are accepted."""

    model: str = Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS)
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[AnthropicBlock] | None = None
    tools: list[AnthropicTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: AnthropicToolChoice | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=TOP_K_MAX)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    service_tier: str | None = None
