"""The request bodies the server accepts, as pydantic models of OpenAI's schema (plus vLLM's sampling
extras), so that every malformed field is refused with a 400 naming it before any work is done.

Unknown top-level fields are refused (``extra_body={"tpo_k": 5}`` is a typo the caller must hear
about, not a silently ignored setting). Fields of OpenAI's API that change nothing here (``user``,
``metadata``, ``store``, ``parallel_tool_calls``, ``service_tier``) are accepted and ignored. Logprobs
are always returned; ``logprobs`` only picks their form for groupwise's own clients (server.py).
Numbers are strict (no ``"5"`` for 5, no NaN or Infinity).
Tool schemas are checked as JSON Schema whenever tools are given, not only when a call is forced:
here only against the bounds of request_limits.py (one cheap pass, while the body is parsed), and
against the meta-schema later, off the event loop (prepare.py). Validate with
``model_validate_json(raw, context=limits_context())`` so that all of a request's schemas share one
budget of nodes.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, ValidationInfo, field_validator,
                      model_validator)

from groupwise.inference.request_limits import MAX_MODEL_NAME_CHARS, MAX_TOOLS, SchemaBudget
from groupwise.inference.requests import GenerationRequest
from groupwise.inference.sampling import SEED_MAX, SEED_MIN, TOP_K_MAX, SamplingParams

__all__ = ["DEFAULT_RETURN_TOKENS_AS_TOKEN_IDS", "ChatCompletionRequest", "CompletionRequest", "Message", "MessagesRequest",
           "ResponsesRequest", "Tool", "describe_validation_error",
           "limits_context", "unparsable_param"]

MAX_STOP = 8
MAX_GUIDED_CHOICES = 256
DEFAULT_RETURN_TOKENS_AS_TOKEN_IDS = True


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def limits_context() -> dict[str, Any]:
    """The validation context of one request body: the node budget its schemas share."""
    return {"schema_budget": SchemaBudget()}


def _budget(info: ValidationInfo) -> SchemaBudget:
    context = info.context if isinstance(info.context, dict) else {}
    return context.get("schema_budget") or SchemaBudget()


class FunctionDefinition(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$",
                      description="letters, digits, _ . - (at most 64), as OpenAI requires")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is None:
            return value
        if value.get("type", "object") != "object":
            raise ValueError(f"a function's parameters must be an object schema, got type {value.get('type')!r}")
        _budget(info).check(value, "parameters")
        return value


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: str = ""

    @field_validator("type")
    @classmethod
    def _text_only(cls, value: str) -> str:
        if value != "text":
            raise ValueError(f"content parts of type {value!r} are not supported: this server serves text "
                             "models (send text parts only)")
        return value


class Message(BaseModel):
    """One chat message. Unknown keys of a message are ignored (SDKs echo back fields like ``refusal``)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _by_role(self) -> "Message":
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only assistant messages carry tool_calls (this one is {self.role!r})")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content")
        return self

    def as_dict(self) -> dict[str, Any]:
        """The message as groupwise.chat.prepare_messages takes it (content parts as dicts)."""
        return self.model_dump(exclude_none=True)


class NamedToolChoice(_Strict):
    class _Function(_Strict):
        name: str

    type: Literal["function"]
    function: _Function


class JsonSchemaSpec(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _schema(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        _budget(info).check(value, "response_format.json_schema.schema")
        return value


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _needs_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs json_schema: {name, schema}")
        return self

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class StreamOptions(_Strict):
    include_usage: bool = False


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _Sampling(_Strict):
    """The sampling fields shared by both endpoints: OpenAI's, then vLLM's extras (``extra_body``)."""

    model: str = Field(min_length=1, max_length=MAX_MODEL_NAME_CHARS)
    n: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = Field(None, validate_default=True)
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool = False
    user: str | None = None  # accepted, unused
    # vLLM's extras
    top_k: int | None = Field(None, ge=-1, le=TOP_K_MAX)
    min_p: Probability | None = None
    repetition_penalty: float | None = Field(None, gt=0.0)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    # vLLM's: write each logprob entry's token as "token_id:<id>" (None: this server's default, on)
    return_tokens_as_token_ids: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP or not all(stops):
            raise ValueError(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them")
        return stops

    @property
    def tokens_as_ids(self) -> bool:
        """Whether logprob entries name their token by id (``"token_id:<id>"``). On unless the request
        says no, as on ART's vLLM server: a client layer that keeps a choice's logprobs but drops the
        fields it does not know (LiteLLM 1.65 keeps no ``token_ids``) still hands the trainer the
        sampled ids (`groupwise.core.choices.choice_token_ids` reads them back), where re-tokenizing the text
        would not always give the tokens sampled."""
        return DEFAULT_RETURN_TOKENS_AS_TOKEN_IDS if self.return_tokens_as_token_ids is None \
            else self.return_tokens_as_token_ids

    def generation_request(self, prompt_ids: list[int], *, max_new_tokens: int | None, top_logprobs: int,
                           adapter: str | None, constraint: Any) -> GenerationRequest:
        """What the engine runs for this request."""
        return GenerationRequest(prompt_ids, max_new_tokens=max_new_tokens, sampling=self.sampling_params(top_logprobs),
                                 n=self.n, stop=self.stop, stop_token_ids=self.stop_token_ids or [],
                                 ignore_eos=self.ignore_eos, adapter=adapter, constraint=constraint)

    def sampling_params(self, top_logprobs: int = 0) -> SamplingParams:
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            seed=self.seed,
            top_logprobs=top_logprobs,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
        )


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    response_format: ResponseFormat | None = None
    stream_options: StreamOptions | None = None
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None  # logprobs are always returned; this picks their form (server.py)
    top_logprobs: int = Field(0, ge=0, le=20)
    metadata: dict[str, str] | None = None  # accepted, unused
    store: bool | None = None  # accepted, unused
    parallel_tool_calls: bool | None = None  # accepted: every call the model writes is returned
    service_tier: str | None = None  # accepted, unused
    # vLLM's: variables for the chat template (Qwen3's `enable_thinking`); a template ignores the rest
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the answer is one of these texts, exactly (a grammar; ART's teacher guidance sends it)
    guided_choice: list[str] | None = Field(None, min_length=1, max_length=MAX_GUIDED_CHOICES)
    # OpenAI's setting of its reasoning models: accepted, no effect (a chat template that thinks
    # takes `chat_template_kwargs`, e.g. Qwen3's enable_thinking)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _guided_json(cls, data: Any) -> Any:
        """vLLM's ``guided_json`` (a JSON schema, or its JSON text; ART's vLLM server took it, and programs
        of its time send it in ``extra_body``) is this request's ``response_format`` json_schema, checked
        and compiled as one."""
        if not isinstance(data, dict) or data.get("guided_json") is None:
            return data
        data = dict(data)
        schema = data.pop("guided_json")
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError:
                raise ValueError("guided_json is text that is not JSON: send a JSON schema (an object)") from None
        if not isinstance(schema, dict):
            raise ValueError("guided_json must be a JSON schema (an object)")
        if data.get("response_format") is not None or data.get("guided_choice") is not None:
            raise ValueError("guided_json cannot be combined with response_format or guided_choice: send one constraint")
        data["response_format"] = {"type": "json_schema", "json_schema": {"name": "guided_json", "schema": schema}}
        return data

    @field_validator("tools", mode="before")
    @classmethod
    def _tool_count(cls, value: Any) -> Any:
        # before the tools are validated one by one: 64,000 of them must cost a len(), not a parse each
        if isinstance(value, list) and len(value) > MAX_TOOLS:
            raise ValueError(f"{len(value)} tools, more than this server's bound of {MAX_TOOLS} per request")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _forced_tool_exists(cls, value: Any, info: ValidationInfo) -> Any:
        tools = info.data.get("tools") or []
        if (value == "required" or isinstance(value, NamedToolChoice)) and not tools:
            raise ValueError("tool_choice forces a tool call but the request has no tools")
        if isinstance(value, NamedToolChoice):
            names = [t.function.name for t in tools]
            if value.function.name not in names:
                raise ValueError(f"tool_choice names function {value.function.name!r}, which is not among the "
                                 f"tools {names}")
        return value

    @field_validator("guided_choice")
    @classmethod
    def _one_constraint(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and (info.data.get("tool_choice") not in (None, "auto", "none")
                                  or info.data.get("response_format") is not None):
            raise ValueError("guided_choice cannot be combined with a forced tool_choice or a response_format: "
                             "send one constraint")
        if value is not None and not all(value):
            raise ValueError("guided_choice must list non-empty texts")
        return value

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def tool_choice_value(self) -> Any:
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.model_dump()
        return self.tool_choice


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=20)  # alternatives per position, as in OpenAI's API
    response_format: ResponseFormat | None = None


# ------------------------------------------------------------------ OpenAI's Responses API (POST /v1/responses)
# Validated here so that a bad field is a 400 naming it; translated into a chat request by
# groupwise.chat.protocols. Input items and content parts are strict about their own fields; what the
# SDKs echo back from an earlier answer (ids, status, annotations, logprobs) is accepted.


class _Echoed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ResponsesContentPart(_Echoed):
    type: Literal["input_text", "output_text", "refusal", "input_image", "input_file", "input_audio"]
    text: str | None = None
    refusal: str | None = None
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class ResponsesMessageItem(_Echoed):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[ResponsesContentPart]
    id: str | None = None
    status: str | None = None


class ResponsesFunctionCallItem(_Echoed):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None
    status: str | None = None


class ResponsesFunctionCallOutputItem(_Echoed):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ResponsesContentPart]
    id: str | None = None
    status: str | None = None


class ResponsesReasoningItem(_Echoed):
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


class ResponsesFunctionTool(_Strict):
    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if value is not None:
            _budget(info).check(value, "parameters")
        return value


class ResponsesToolChoice(_Strict):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponsesText(_Strict):
    format: ResponsesTextFormat | None = None
    verbosity: str | None = None  # accepted, unused


class ResponsesRequest(_Strict):
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


# ------------------------------------------------------------------ Anthropic's Messages API (POST /v1/messages)


class AnthropicBlock(_Echoed):
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


class AnthropicMessage(_Echoed):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicBlock]


class AnthropicTool(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None

    @field_validator("input_schema")
    @classmethod
    def _schema(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        _budget(info).check(value, "input_schema")
        return value


class AnthropicToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> "AnthropicToolChoice":
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("tool_choice names a tool exactly when its type is 'tool'")
        return self


class MessagesRequest(_Strict):
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


def _field_names(*models: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    todo, seen = list(models), set(models)
    while todo:
        m = todo.pop()
        for name, f in m.model_fields.items():
            names.add(f.alias or name)
            for arg in _model_args(f.annotation):
                if arg not in seen:  # a recursive model (a block holding blocks) is walked once
                    seen.add(arg)
                    todo.append(arg)
    return names


def _model_args(annotation: Any) -> list[type[BaseModel]]:
    from typing import get_args

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in get_args(annotation) for m in _model_args(a)]


_FIELDS = _field_names(ChatCompletionRequest, CompletionRequest, ResponsesRequest, MessagesRequest)


_MAX_NUMBER_DIGITS = 4300  # pydantic's JSON parser refuses an integer literal longer (Python's own int limit)


class _NumberText(str):
    """A JSON number as written (`unparsable_param` reads numbers it cannot convert)."""


def unparsable_param(raw: bytes) -> str | None:
    """Where a body that is JSON by the standard, but not to pydantic's parser, holds what the parser
    refuses: a lone surrogate escape (``"\\ud800"``) in a string or a key, or an integer of more than
    4,300 digits. Named as `describe_validation_error` names fields (``messages[0].content``); None
    when the body is not JSON at all (a syntax error names no field)."""
    import json

    try:
        doc = json.loads(raw, parse_int=_NumberText, parse_float=_NumberText)
    except (ValueError, RecursionError):
        return None

    def refused(text: str) -> bool:
        if isinstance(text, _NumberText):
            return len(text) > _MAX_NUMBER_DIGITS
        return any("\ud800" <= c <= "\udfff" for c in text)

    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            if refused(value):
                return path or None
        elif isinstance(value, dict):
            for key in reversed(list(value)):
                at = f"{path}.{key}" if path else key
                if refused(key):
                    return at
                stack.append((at, value[key]))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def describe_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """(message, param) of a 400 for `exc`: each failing field named as ``messages[2].tool_calls[0]``.

    pydantic's locations also hold the union member tried (``str``, ``list[int]``, a model's name);
    those are dropped. A union that failed every way says what each member wanted ("a valid string
    or a valid array"), unless one member got further (a bad content part beats "not a string").
    """
    found: dict[str, list[tuple[str, str]]] = {}
    for err in exc.errors(include_url=False, include_input=False):  # the input may be megabytes
        param = ""
        for part in err["loc"]:
            if isinstance(part, int):
                param += f"[{part}]"
            elif part in _FIELDS or (err["type"] == "extra_forbidden" and part == err["loc"][-1]):
                param += f".{part}" if param else part
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field: this server does not accept it (check its spelling)"
        elif err["type"] == "json_invalid":
            why = str(err.get("ctx", {}).get("error", msg))
            msg = f"the request body is not valid JSON: {why}"
            if "hex escape" in why or "unicode code point" in why:  # what the parser says of both
                msg += (" (strings must be UTF-8 text: a lone surrogate escape such as \\ud800, or bytes that are "
                        "not UTF-8, is no text; replace it before sending, e.g. with U+FFFD)")
        elif err["type"] == "model_type" and not param:
            msg = "the request body must be a JSON object"
        found.setdefault(param, []).append((err["type"], msg))
    deeper = {p for p in found for q in found if q != p and p and (q.startswith(p + ".") or q.startswith(p + "["))}
    told: list[tuple[str, str]] = []
    for param, errs in found.items():
        if param in deeper and all(t.endswith("_type") for t, _ in errs):
            continue  # a union member that got further explains better
        msgs = list(dict.fromkeys(m for _, m in errs))
        if all(t.endswith("_type") for t, _ in errs) and len(msgs) > 1:
            text = "Input should be " + " or ".join(m.removeprefix("Input should be ") for m in msgs)
        else:
            text = msgs[0]
        told.append((param, text))
    parts = [f"{p}: {m}" if p else m for p, m in told[:3]]
    more = f" (and {len(told) - 3} more)" if len(told) > 3 else ""
    return "invalid request: " + "; ".join(parts) + more, (told[0][0] or None) if told else None
