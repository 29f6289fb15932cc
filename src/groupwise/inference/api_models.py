"""The request bodies the server accepts, as pydantic models of OpenAI's schema (plus vLLM's sampling
extras), so that every malformed field is refused with a 400 naming it before any work is done.

Unknown top-level fields are refused (``extra_body={"tpo_k": 5}`` is a typo the caller must hear
about, not a silently ignored setting). Fields of OpenAI's API that change nothing here (``user``,
``metadata``, ``store``, ``parallel_tool_calls``, ``service_tier``) are accepted and ignored. Logprobs
are always returned; ``logprobs`` only picks their form for groupwise's own clients (server.py).
Numbers are strict (no ``"5"`` for 5, no NaN or Infinity).
The Responses and Messages APIs' bodies are their own modules (api_responses.py, api_messages.py); the
400 that names a bad field (`describe_validation_error`) is written here for all four.
Tool schemas are checked as JSON Schema whenever tools are given, not only when a call is forced:
here only against the bounds of request_limits.py (one cheap pass, while the body is parsed), and
against the meta-schema later, off the event loop (prepare.py). Validate with
``model_validate_json(raw, context=limits_context())`` so that all of a request's schemas share one
budget of nodes.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from groupwise.inference.api_base import Strict, limits_context, schema_budget
# The Responses and Messages bodies live in their own modules; importable from here as before.
from groupwise.inference.api_messages import MessagesRequest
from groupwise.inference.api_responses import ResponsesRequest
from groupwise.inference.request_limits import MAX_MODEL_NAME_CHARS, MAX_TOOLS
from groupwise.inference.requests import GenerationRequest
from groupwise.inference.sampling import REPETITION_PENALTY_RANGE, SEED_MAX, SEED_MIN, TOP_K_MAX, SamplingParams

__all__ = ["DEFAULT_RETURN_TOKENS_AS_TOKEN_IDS", "ChatCompletionRequest", "CompletionRequest", "Message", "MessagesRequest",
           "ResponsesRequest", "Tool", "describe_validation_error",
           "limits_context", "unparsable_param"]

MAX_STOP = 8
MAX_GUIDED_CHOICES = 256
DEFAULT_RETURN_TOKENS_AS_TOKEN_IDS = True


class FunctionDefinition(Strict):
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
        schema_budget(info).check(value, "parameters")
        return value


class Tool(Strict):
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


class NamedToolChoice(Strict):
    class _Function(Strict):
        name: str

    type: Literal["function"]
    function: _Function


class JsonSchemaSpec(Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _schema(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        schema_budget(info).check(value, "response_format.json_schema.schema")
        return value


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _needs_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs json_schema: {name, schema}")
        return self

    def as_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


class StreamOptions(Strict):
    include_usage: bool = False


Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


class _Sampling(Strict):
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
    # its range checked here, so the 400 names the field (SamplingParams checks it again for every caller)
    repetition_penalty: float | None = Field(None, ge=REPETITION_PENALTY_RANGE[0], le=REPETITION_PENALTY_RANGE[1])
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
