"""The body of OpenAI's Responses API (POST /v1/responses), as pydantic models: a bad field is a 400 naming
it (`groupwise.inference.api_models.describe_validation_error`), before any work is done.

Translated into a chat request by groupwise.chat.protocols. Input items and content parts are strict
about their own fields; what the SDKs echo back from an earlier answer (ids, status, annotations,
logprobs) is accepted. Apart from the chat and completions bodies (api_models.py): a second protocol
over the same engine, read by whoever serves it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator

from groupwise.inference.api_base import Echoed, Strict, schema_budget
from groupwise.inference.request_limits import MAX_MODEL_NAME_CHARS, MAX_TOOLS
from groupwise.inference.sampling import SEED_MAX, SEED_MIN, TOP_K_MAX

__all__ = ["ResponsesContentPart", "ResponsesFunctionCallItem", "ResponsesFunctionCallOutputItem",
           "ResponsesFunctionTool", "ResponsesItem", "ResponsesMessageItem", "ResponsesReasoningItem",
           "ResponsesRequest", "ResponsesText", "ResponsesTextFormat", "ResponsesToolChoice"]


class ResponsesContentPart(Echoed):
    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file", "input_audio"]
    text: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class ResponsesMessageItem(Echoed):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponsesContentPart]
    id: str | None = None
    status: str | None = None


class ResponsesFunctionCallItem(Echoed):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class ResponsesFunctionCallOutputItem(Echoed):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ResponsesContentPart]
    id: str | None = None
    status: str | None = None


class ResponsesReasoningItem(Echoed):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[Any] = []
    content: list[Any] | None = None
    encrypted_content: str | None = None
    status: str | None = None


def _item_kind(value: Any) -> str:
    return value.get("type", "message") if isinstance(value, dict) else "message"


ResponsesItem = Annotated[
    Annotated[ResponsesMessageItem, Tag("message")] | Annotated[ResponsesFunctionCallItem, Tag("function_call")]
    | Annotated[ResponsesFunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ResponsesReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind, custom_error_type="item_type",
                  custom_error_message="an input item's type must be message, function_call, function_call_output "
                                       "or reasoning")]


class ResponsesFunctionTool(Strict):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is not None:
            schema_budget(info).check(value, "parameters")
        return value


class ResponsesToolChoice(Strict):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponsesText(Strict):
    format: ResponsesTextFormat | None = None
    verbosity: str | None = None  # accepted, unused


class ResponsesRequest(Strict):
    """A Responses API request. Fields that change nothing here (store, metadata, include, reasoning,
    truncation, parallel_tool_calls, user, service_tier, prompt_cache_key, safety_identifier) are accepted."""

    model: str = Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS)
    input: str | list[ResponsesItem]
    instructions: str | None = None
    tools: list[ResponsesFunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | ResponsesToolChoice | None = None
    text: ResponsesText | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    previous_response_id: str | None = None  # refused when set: nothing is stored (groupwise.chat.protocols)
    # vLLM-style extras (extra_body), as on chat completions
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    top_k: int | None = Field(None, ge=-1, le=TOP_K_MAX)
    stop: str | list[str] | None = None
    # accepted, unused
    store: bool | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: str | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    stream_options: dict[str, Any] | None = None
    background: bool | None = None
    max_tool_calls: int | None = None
