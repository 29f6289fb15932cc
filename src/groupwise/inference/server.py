"""The OpenAI-compatible HTTP API over an `Engine` (FastAPI); `groupwise serve` runs it (serve.py).

Routes: ``POST /v1/chat/completions`` (plain and SSE streaming), ``POST /v1/completions`` (its stream one
chunk, sent once the answer is complete; each choice carries ``prompt_token_ids``),
``GET /v1/models``, ``GET /v1/models/{id}``; and OpenAI's Responses API (``POST /v1/responses``) and
Anthropic's Messages API (``POST /v1/messages``, its errors in Anthropic's shape), each translated into
a chat request and run on the chat route's path (groupwise.chat.protocols). Requests and responses use OpenAI's shapes; request
bodies are validated by the pydantic models of api_models.py. Errors are
``{"error": {"message", "type", "param", "code"}}``: a 4xx names what the caller can fix (the
field, the model, the length), and the server keeps serving. What the server promises (bind, key,
limits, logging) is written down in docs/security.md.

Always returned, because RL needs them (token-in/token-out): every choice's logprobs
(``choice.logprobs.content``; for a groupwise client's request that asks for none, the list
``choice.token_logprobs`` with ``logprobs`` null: `groupwise.core.choices.TOKEN_DATA_HEADER`) and its sampled
token ids in the extra field ``choice.token_ids``
(`groupwise.core.choices.choice_token_ids` reads it), and in ``choice.forced_token_indices`` the indices
into token_ids of the tokens a grammar forced (tool_choice / response_format allowed only that one
token; `choice_forced_indices`), empty when none. ``response.model`` and ``system_fingerprint``
name the step that produced the answer (``name@step``). Each logprob entry names its token
``"token_id:<id>"`` unless the request sends ``return_tokens_as_token_ids: false`` (vLLM's field; on
by default as on ART's vLLM server), so a client layer that keeps logprobs but drops unknown fields
(LiteLLM 1.65) still carries the sampled ids.

How a request runs: the key is checked, the body read up to a limit (413 past it) within a deadline
(408) and validated, its schemas against the bounds of request_limits.py (a 400 naming the bound);
a prompt that cannot fit the context is refused before it is tokenised; a request with schemas has
them checked and its grammar built on the schema workers under a time budget (prepare.py), so
neither the event loop nor the engine waits for them; tokenising runs on the compute thread
(groupwise/runtime/compute.py); the engine validates the request before it joins a batch, so every caller
error is a 4xx before any streaming starts. A client that goes away cancels its request in the
engine; one that goes away while sending its body is logged as one line, not as a server failure.

In-process use (rollouts, tests) goes through `groupwise.inference.client.in_process_client`,
an httpx ASGI transport to this same app: one code path for local and remote.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from groupwise.chat import prompt_ids as chat_prompt_ids
from groupwise.chat import template_kwargs_problem
from groupwise.core.choices import wants_compact_token_data
from groupwise.runtime.compute import compute_thread
from groupwise.errors import ModelNotFoundError
from groupwise.core.http_guard import HostGuard
from groupwise.inference.api_models import (ChatCompletionRequest, CompletionRequest, MessagesRequest,
                                            ResponsesRequest, describe_validation_error, limits_context,
                                            unparsable_param)
from groupwise.inference.constrained import ConstraintError, constraint_for
from groupwise.inference.engine import (EngineError, GenerationRequest, GenerationResult, PromptTooLongError,
                                        RequestFailedError, RequestMemoryError)
from groupwise.inference.engine_client import EngineProcessDied
from groupwise.inference.memory_release import ReleaseAfterLargeBodies
from groupwise.inference.prepare import (DEFAULT_PREPARE_BUDGET_S, OverBudget, Preparer, SchemaProblem,
                                         check_request_schemas)
from groupwise.inference.registry import ModelRegistry, Resolved
from groupwise.inference.request_limits import DEFAULT_MAX_BODY_BYTES, body_structure_problem
from groupwise.inference.responses import TokenTexts, chat_response, completion_response
from groupwise.inference.streaming import EngineStream, stream_chat
from groupwise.chat.protocols import (ProtocolError, messages_answer, messages_events, messages_to_chat, responses_answer,
                                 responses_events, responses_to_chat)

__all__ = ["DEFAULT_BODY_TIMEOUT_S", "DEFAULT_MAX_BODY_BYTES", "ApiError", "create_app"]

log = logging.getLogger("groupwise.serve")

DEFAULT_BODY_TIMEOUT_S = 60.0  # the whole body: 8 MiB at 140 KB/s; a slow sender's socket is not held longer


class ApiError(Exception):
    """An error answered in OpenAI's shape. 5xx answers tell the SDK not to retry (``x-should-retry``):
    the same request would fail the same way, and a retried poisonous request costs three times."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        """The error as Anthropic's API writes it (the Messages route): no ``param``, so the message names
        the field, as every 400 of this server's does."""
        kind = _ANTHROPIC_ERROR_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, anthropic: bool = False) -> JSONResponse:
        headers = {"x-should-retry": "false"} if self.status >= 500 else {}
        if self.status == 401:
            headers["www-authenticate"] = "Bearer"
        body = self.anthropic_body() if anthropic else self.body()
        return JSONResponse(body, status_code=self.status, headers=headers)


_ANTHROPIC_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                          413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


@dataclass
class ServerState:
    """What the handlers share: the registry (and its engine), the key, the limits."""

    registry: ModelRegistry
    api_key: str | None
    max_body_bytes: int
    body_timeout_s: float
    preparer: Preparer
    max_token_chars: int = field(init=False, repr=False)  # the vocabulary's longest entry
    token_texts: TokenTexts = field(init=False, repr=False)  # sampled tokens' texts, for the responses

    def __post_init__(self) -> None:
        self.max_token_chars = max(len(t) for t in self.tokenizer.get_vocab())
        self.token_texts = TokenTexts(self.tokenizer)

    @property
    def engine(self) -> Any:
        return self.registry.engine

    @property
    def tokenizer(self) -> Any:
        return self.registry.engine.tokenizer

    def max_prompt_chars(self) -> int:
        """Characters beyond which a text cannot fit the context whatever its tokens: every token
        covers at most as many characters as the vocabulary's longest entry."""
        return self.engine.context_length * self.max_token_chars


# ---------------------------------------------------------------------------------------- app


def create_app(registry: ModelRegistry, *, api_key: str | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
               prepare_budget_s: float = DEFAULT_PREPARE_BUDGET_S, allowed_hosts: Iterable[str] = (),
               bound_host: str | None = None, routers: Iterable[APIRouter] = ()) -> FastAPI:
    """The FastAPI app serving `registry` (one engine). `api_key`: require ``Bearer <key>`` on every
    route, the docs included, but the liveness probe ``GET /health``. `max_body_bytes`: larger request bodies get 413; `body_timeout_s`:
    one that takes longer to arrive gets 408. `prepare_budget_s`: a request whose schema checks and
    grammar building run longer gets 400 (prepare.py). Every request must name the server in ``Host``
    (localhost, `bound_host`, the address it arrived at, or one of `allowed_hosts`) and a browser's
    ``Origin`` must be a page of it, else 403 (groupwise.core.http_guard: against DNS rebinding).
    `routers`: more routes (adapter_routes.py's, which load and unload adapters)."""
    app = FastAPI(title="groupwise", version="0.1", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gw = ServerState(registry, api_key, max_body_bytes, body_timeout_s, Preparer(prepare_budget_s))
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(_InternalErrors)
    app.add_middleware(ReleaseAfterLargeBodies)  # a large body's heap goes back to the OS once answered
    app.add_middleware(HostGuard, allowed=tuple(allowed_hosts), bound=bound_host)  # outermost: before anything
    app.include_router(api)
    app.include_router(docs)
    app.include_router(probes)
    for router in routers:
        app.include_router(router)
    return app


async def _api_error(request: Request, exc: ApiError) -> Response:
    return exc.response(anthropic=request.url.path.rstrip("/").endswith("/v1/messages"))


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    if exc.status_code in (404, 405):
        message = (f"no route {request.method} {request.url.path}; this server answers POST /v1/chat/completions, "
                   "POST /v1/completions, POST /v1/responses, POST /v1/messages, GET /v1/models, GET /v1/models/{id} and GET /health")
        return ApiError(exc.status_code, message, code="unknown_url" if exc.status_code == 404 else None).response()
    return await _api_error(request, ApiError(exc.status_code, str(exc.detail)))


async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
    first = exc.errors()[0] if exc.errors() else {}
    return await _api_error(request, ApiError(400, f"invalid request: {first.get('msg', exc)}"))


class _InternalErrors:
    """A server bug answers 500 in OpenAI's shape and the connection stays usable.

    Starlette's own 500 handler re-raises after answering, and uvicorn then drops the keep-alive
    connection, so a client's next request on it failed with a read error. Here the exception is
    logged with its traceback and a request id, and the client gets the id, not the exception text.
    """

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: dict) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            rid = f"req-{uuid.uuid4().hex[:12]}"
            log.exception("%s %s failed (%s)", scope.get("method"), scope.get("path"), rid)
            if started:  # mid-response: nothing can be said any more
                raise
            error = ApiError(500, f"the server failed on this request ({type(exc).__name__}); its log has the "
                             f"details under {rid}", type="server_error", code="internal_error")
            await error.response()(scope, receive, send)


# ---------------------------------------------------------------------------------------- dependencies


def server_state(request: Request) -> ServerState:
    return request.app.state.gw


async def current_state(request: Request) -> ServerState:
    """`server_state` as a route's dependency. FastAPI runs a plain function dependency in anyio's worker
    threads: a thread hop per request and route, at most 40 at once, which 256 concurrent rollouts queue
    for. An ``async def`` one runs on the event loop."""
    return server_state(request)


async def require_key(request: Request) -> None:
    """``Authorization: Bearer <key>`` when the server has a key (compared in constant time); or
    ``x-api-key: <key>``, the header Anthropic's SDK sends it in."""
    key = server_state(request).api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if "x-api-key" in request.headers and "authorization" not in request.headers:
        given = "Bearer " + request.headers["x-api-key"]
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                       type="authentication_error", code="invalid_api_key")


async def read_body(request: Request, limit: int, timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit` bytes, and with
    408 if it has not arrived whole within `timeout_s`. A client that hangs up while sending it is
    a client event: one log line, no traceback (nobody is left to answer)."""
    too_big = ApiError(413, f"the request body is over this server's limit of {limit} bytes (groupwise serve "
                       "--max-body-bytes)", code="request_too_large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_big
                chunks.append(chunk)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within this server's {timeout_s:g} s "
                       f"({size} bytes came)", code="request_timeout") from None
    except ClientDisconnect:
        client = request.client
        log.info("client %s went away while sending its request body (%d bytes came); nothing was run",
                 f"{client.host}:{client.port}" if client else "?", size)
        raise ApiError(499, "the client closed the connection", code="client_closed_request") from None
    return b"".join(chunks)


def check_content_type(request: Request) -> None:
    """A body sent as anything but JSON is refused (415). The types a web page may send cross-origin without
    asking first (text/plain, forms) would otherwise let any page the user opens make this server generate;
    a request without the header is a script's and is read as JSON."""
    given = request.headers.get("content-type")
    if given is None:
        return
    media = given.split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, f"the request body is sent as {media!r}; this server reads JSON: send 'Content-Type: "
                       "application/json' (curl: -H 'Content-Type: application/json')", code="unsupported_media_type")


def parsed(model: type) -> Any:
    """A dependency: the body read (within the limit) and validated as `model`; a 400 naming the field."""

    async def dependency(request: Request) -> Any:
        state = server_state(request)
        check_content_type(request)
        raw = await read_body(request, state.max_body_bytes, state.body_timeout_s)
        if (problem := body_structure_problem(raw, state.engine.context_length)) is not None:
            raise ApiError(400, problem, code="request_too_complex")
        try:
            return model.model_validate_json(raw, context=limits_context())
        except ValidationError as exc:
            message, param = describe_validation_error(exc)
            if param is None and any(e["type"] == "json_invalid" for e in exc.errors(include_input=False)):
                param = unparsable_param(raw)  # JSON by the standard: say which field the parser refused
                if param:
                    message = f"{message} (in {param})"
            raise ApiError(400, message, param=param) from None

    return dependency


def resolve(state: ServerState, model: str) -> Resolved:
    try:
        return state.registry.resolve(model)
    except ModelNotFoundError as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from None


def check_n(state: ServerState, n: int) -> None:
    limit = getattr(state.engine, "max_batch_size", None)
    if limit is not None and n > limit:
        raise ApiError(400, f"n={n}: this server gives at most {limit} choices per request (its batch size)",
                       param="n")


def _text_chars(value: Any) -> int:
    """Characters of every string in a message (content, tool calls' names and arguments, ids): what its
    rendering holds, counted before the template runs."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_chars(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_text_chars(v) for v in value)
    return 0


def too_long(state: ServerState, chars: int) -> ApiError | None:
    if chars <= state.max_prompt_chars():
        return None
    return ApiError(400, f"the prompt has {chars} characters, more than any {state.engine.context_length}-token "
                    "context can hold; shorten the conversation (or drop old turns)",
                    param="messages", code="context_length_exceeded")


def submit(state: ServerState, req: GenerationRequest, prompt_param: str) -> concurrent.futures.Future:
    """Queue `req`; the engine's own checks (length, ids, seed) answer 400 before anything is sent."""
    try:
        return state.engine.submit(req)
    except PromptTooLongError as exc:
        raise ApiError(400, str(exc), param=prompt_param, code="context_length_exceeded") from None
    except RequestMemoryError as exc:
        raise ApiError(400, str(exc), param="max_tokens", code="memory_limit_exceeded") from None
    except EngineProcessDied as exc:
        raise engine_gone(exc) from None
    except EngineError as exc:
        raise ApiError(400, str(exc)) from None


def engine_gone(exc: EngineProcessDied) -> ApiError:
    """The 503 of every request once the engine core process is gone: its message names the exit."""
    return ApiError(503, str(exc), type="server_error", code="engine_process_died")


async def result_of(request: Request, future: concurrent.futures.Future) -> GenerationResult:
    """The engine's answer; if the client goes away first, its request is cancelled in the engine."""
    waiter = asyncio.wrap_future(future)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait({waiter, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        future.cancel()
        raise
    finally:
        gone.cancel()
    if waiter not in done:
        future.cancel()
        waiter.cancel()
        raise ApiError(499, "the client closed the connection", code="client_closed_request")
    try:
        return waiter.result()
    except RequestMemoryError as exc:  # refused at admission: it can never fit what the device has free
        raise ApiError(400, str(exc), param="max_tokens", code="memory_limit_exceeded") from None
    except RequestFailedError as exc:
        log.error("a request failed in the engine: %s", exc)
        raise ApiError(500, "generation failed for this request; the other requests went on (see the server log)",
                       type="server_error", code="generation_failed") from None
    except EngineProcessDied as exc:
        raise engine_gone(exc) from None
    except EngineError as exc:  # the whole engine failed a step, or was closed
        log.error("the engine could not run a request: %s", exc)
        raise ApiError(503, "the engine could not run this request: it failed or was closed (see the server log)",
                       type="server_error", code="engine_unavailable") from None


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body is read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ---------------------------------------------------------------------------------------- routes

api = APIRouter(prefix="/v1", dependencies=[Depends(require_key)])
docs = APIRouter(dependencies=[Depends(require_key)], include_in_schema=False)
# vLLM's liveness route, without the key as there: what orchestrators' probes and ART-era scripts that
# wait for their server poll. It says only whether the engine still takes requests.
probes = APIRouter(include_in_schema=False)


@probes.get("/health")
async def health(state: ServerState = Depends(current_state)) -> Response:
    if isinstance(failure := getattr(state.engine, "failure", None), EngineProcessDied):
        return engine_gone(failure).response()
    if getattr(state.engine, "closed", False):
        return ApiError(503, "the engine is closed", type="server_error", code="engine_closed").response()
    return Response(status_code=200)


@docs.get("/openapi.json")
async def openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@docs.get("/docs")
async def swagger_ui() -> Response:
    return get_swagger_ui_html(openapi_url="/openapi.json", title="groupwise API")


@api.get("/models")
async def list_models(state: ServerState = Depends(current_state)) -> dict[str, Any]:
    now = int(time.time())
    return {"object": "list", "data": [_model_card(m, now) for m in state.registry.served_ids()]}


@api.get("/models/{model_id:path}")
async def get_model(model_id: str, state: ServerState = Depends(current_state)) -> dict[str, Any]:
    resolve(state, model_id)
    return _model_card(model_id, int(time.time()))


def _model_card(model_id: str, created: int) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": created, "owned_by": "groupwise"}


@api.post("/chat/completions")
async def chat_completions(request: Request, body: ChatCompletionRequest = Depends(parsed(ChatCompletionRequest)),
                           state: ServerState = Depends(current_state)) -> Any:
    compact = wants_compact_token_data(request.headers) and not body.logprobs and not body.top_logprobs
    return await run_chat(request, state, body, compact)


async def run_chat(request: Request, state: ServerState, body: ChatCompletionRequest, compact: bool) -> Response:
    """A chat request run on the engine: its SSE stream, or its answer's JSON bytes in a Response (the
    Responses and Messages routes run their requests translated into chat requests through here)."""
    target = resolve(state, body.model)
    check_n(state, body.n)
    messages = [m.as_dict() for m in body.messages]
    tools = body.tool_dicts()
    tool_choice = body.tool_choice_value()
    chars = sum(_text_chars(m) for m in messages) + len(str(tools or ""))  # tool-call arguments count too
    if (error := too_long(state, chars)) is not None:
        raise error
    if (problem := template_kwargs_problem(state.tokenizer, body.chat_template_kwargs)) is not None:
        raise ApiError(400, problem, param="chat_template_kwargs")
    response_format = body.response_format.as_dict() if body.response_format else None
    constraint = await prepare(state, tools, tool_choice, response_format, body.guided_choice)
    prompt_ids = await compute_thread().run(_render_chat, state.tokenizer, messages, tools, body.chat_template_kwargs)
    parse_tools = bool(tools) and tool_choice != "none"
    header = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": target.served_as,
              "system_fingerprint": target.served_as}
    req = body.generation_request(prompt_ids, max_new_tokens=body.max_new_tokens, top_logprobs=body.top_logprobs,
                                  adapter=target.adapter, constraint=constraint)
    req.follow = target.follow
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        req.on_token = lambda index, token, logprob, finish: loop.call_soon_threadsafe(
            queue.put_nowait, (index, token, logprob))
        # submitted before the stream starts: a bad request is a 400, not an in-band error
        future = submit(state, req, "messages")
        return EngineStream(stream_chat(state.token_texts, future, queue, req, header, parse_tools, include_usage,
                                        body.tokens_as_ids),
                            future)
    result = await result_of(request, submit(state, req, "messages"))
    # the body's bytes, not a dict: FastAPI would walk a returned dict with jsonable_encoder first, about
    # 2 ms of the GIL for a 128-token choice's logprobs, on the process that steps the engine
    # a groupwise client that asked for no logprobs reads them from one list (groupwise.core.trajectory says why)
    # on a worker thread: n choices of the whole context with 20 alternatives a token is a body of 100+ MB,
    # seconds of work that on the event loop held every other caller's answer
    answer = await asyncio.to_thread(chat_response, state.token_texts, result, header, parse_tools,
                                     body.tokens_as_ids, compact)
    return Response(answer, media_type="application/json")


async def prepare(state: ServerState, tools: list[dict] | None, tool_choice: Any,
                  response_format: dict | None, guided_choice: list[str] | None = None) -> Any:
    """The request's schemas checked and its grammar (None without one), on the schema workers
    under their time budget (prepare.py); a request without schemas never waits for them."""
    if not tools and not guided_choice and (response_format or {}).get("type") in (None, "text"):
        return None
    try:
        return await state.preparer.run(_build_constraint, state.tokenizer, tools, tool_choice, response_format,
                                        guided_choice)
    except OverBudget:
        raise ApiError(400, f"checking this request's schemas and building its grammar took longer than this "
                       f"server's budget of {state.preparer.budget_s:g} s; send smaller schemas (fewer "
                       "branches, simpler patterns)", param="tools" if tools else "response_format",
                       code="schema_too_complex") from None


def _build_constraint(tokenizer: Any, tools: list[dict] | None, tool_choice: Any,
                      response_format: dict | None, guided_choice: list[str] | None) -> Any:
    try:
        check_request_schemas(tools, response_format)
    except SchemaProblem as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    try:
        return constraint_for(tokenizer, response_format=response_format, tools=tools, tool_choice=tool_choice,
                              guided_choice=guided_choice)
    except ConstraintError as exc:
        raise ApiError(400, str(exc), param="guided_choice" if guided_choice else "tool_choice"
                       if tool_choice not in (None, "auto", "none") else "response_format") from None


def _render_chat(tokenizer: Any, messages: list[dict], tools: list[dict] | None,
                 template_kwargs: dict | None = None) -> list[int]:
    """Prompt ids of a chat request (on the compute thread: a long conversation takes long).
    Rendered by the chat layer, as the trainer renders the conversation (token-in/token-out). The tools
    are rendered whatever the tool_choice: "none" forbids a call, not the tools (OpenAI's and vLLM's
    servers show them too), and a trajectory keeps its tools but not its tool_choice, so the trainer
    renders them; a prompt without them would not be the one trained on."""
    try:
        return chat_prompt_ids(tokenizer, messages, tools, template_kwargs=template_kwargs)
    except Exception as exc:  # a template may reject a message layout (e.g. roles out of order)
        raise ApiError(400, f"the chat template cannot render these messages: {exc}", param="messages") from None


@api.post("/completions")
async def completions(request: Request, body: CompletionRequest = Depends(parsed(CompletionRequest)),
                      state: ServerState = Depends(current_state)) -> Any:
    target = resolve(state, body.model)
    check_n(state, body.n)
    if isinstance(body.prompt, str):
        if (error := too_long(state, len(body.prompt))) is not None:
            error.param = "prompt"
            raise error
    else:
        vocab = getattr(state.engine, "vocab_size", None) or len(state.tokenizer)
        bad = [t for t in body.prompt if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"prompt has token ids outside the vocabulary [0, {vocab}): {bad[:5]}", param="prompt")
    response_format = body.response_format.as_dict() if body.response_format else None
    constraint = await prepare(state, None, None, response_format)
    prompt_ids = await compute_thread().run(_render_completion, state.tokenizer, body.prompt)
    req = body.generation_request(prompt_ids, max_new_tokens=body.max_tokens, top_logprobs=body.logprobs or 0,
                                  adapter=target.adapter, constraint=constraint)
    req.follow = target.follow
    result = await result_of(request, submit(state, req, "prompt"))
    answer = await asyncio.to_thread(completion_response, state.token_texts, result, target.served_as,
                                     body.tokens_as_ids, prompt_ids)  # off the event loop, as a chat answer
    if body.stream:  # the whole answer as one chunk, once complete (as the Responses and Messages streams)
        return Response(b"data: " + answer + b"\n\ndata: [DONE]\n\n", media_type="text/event-stream")
    return Response(answer, media_type="application/json")


def _render_completion(tokenizer: Any, prompt: str | list[int]) -> list[int]:
    return tokenizer(prompt, add_special_tokens=False)["input_ids"] if isinstance(prompt, str) else list(prompt)


# ---------------------------------------------------------------------------------------- Responses, Messages


def _as_chat(chat: dict[str, Any]) -> ChatCompletionRequest:
    """A translated request as the chat route's validated body: the same checks, the same engine path."""
    try:
        return ChatCompletionRequest.model_validate(chat, context=limits_context())
    except ValidationError as exc:
        message, _ = describe_validation_error(exc)
        raise ApiError(400, f"{message} (in the chat request this one translates to)") from None


async def _translated(request: Request, state: ServerState, body: Any, to_chat: Any) -> dict[str, Any]:
    """The chat answer (its body as a dict, one choice, token data as plain lists) of a translated request."""
    try:
        chat = to_chat(body.model_dump(by_alias=True, exclude_none=True, warnings=False))
    except ProtocolError as exc:
        raise ApiError(400, str(exc), param=exc.param) from None
    answer = json.loads((await run_chat(request, state, _as_chat(chat), compact=True)).body)
    choice = answer["choices"][0]
    if choice.get("logprobs"):  # alternatives were asked for: the entries carry the logprobs
        choice["token_logprobs"] = [e["logprob"] for e in choice["logprobs"]["content"]]
    return answer


def _sse(events: list[tuple[str, dict[str, Any]]]) -> Response:
    text = "".join(f"event: {kind}\ndata: {json.dumps(data)}\n\n" for kind, data in events)
    return Response(text, media_type="text/event-stream")


@api.post("/responses")
async def responses(request: Request, body: ResponsesRequest = Depends(parsed(ResponsesRequest)),
                    state: ServerState = Depends(current_state)) -> Response:
    """OpenAI's Responses API as a chat request (groupwise.chat.protocols). A stream sends its events once the
    answer is complete: the same events and the same final object as OpenAI's, not token by token."""
    answer = responses_answer(await _translated(request, state, body, responses_to_chat),
                              body.model_dump(by_alias=True, exclude_none=True, warnings=False))
    return _sse(responses_events(answer)) if body.stream else JSONResponse(answer)


@api.post("/messages")
async def messages(request: Request, body: MessagesRequest = Depends(parsed(MessagesRequest)),
                   state: ServerState = Depends(current_state)) -> Response:
    """Anthropic's Messages API as a chat request (groupwise.chat.protocols); errors in Anthropic's shape
    (`ApiError.response`). A stream sends its events once the answer is complete."""
    answer = messages_answer(await _translated(request, state, body, messages_to_chat))
    return _sse(messages_events(answer)) if body.stream else JSONResponse(answer)
