"""The OpenAI-compatible HTTP API over an `Engine` (FastAPI), and `groupwise serve`.

Routes: ``POST /v1/chat/completions`` (plain and SSE streaming), ``POST /v1/completions``,
``GET /v1/models``. Requests and responses use OpenAI's shapes; errors are
``{"error": {"message", "type", "param", "code"}}`` with a 4xx for anything the caller can fix
(unknown model -> 404 listing what is served; empty messages, max_tokens < 1, a prompt over the
context, invalid JSON, a bad schema -> 400), and the server keeps serving.

Always returned, because RL needs them (token-in/token-out): every choice's logprobs
(``choice.logprobs.content``) and its sampled token ids in the extra field ``choice.token_ids``
(`groupwise.types.choice_token_ids` reads it). ``response.model`` and ``system_fingerprint``
name the step that produced the answer (``name@step``).

In-process use (rollouts, tests) goes through `groupwise.inference.client.in_process_client`,
an httpx ASGI transport to this same app: one code path for local and remote.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from groupwise.errors import ModelNotFoundError
from groupwise.inference.constrained import ConstraintError, constraint_for
from groupwise.inference.engine import EngineError, GenerationRequest, GenerationResult, PromptTooLongError
from groupwise.inference.registry import ModelRegistry
from groupwise.inference.sampling import SamplingParams
from groupwise.inference.tool_calls import parse_tool_calls, prepare_messages

__all__ = ["ApiError", "create_app", "run_serve"]


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


def _number(body: dict, key: str, default: Any, *, kind=float, lo=None, hi=None, lo_open=False) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise ApiError(400, f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}", param=key)
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ApiError(400, f"{key}={value} must be {'>' if lo_open else '>='} {lo}", param=key)
    if hi is not None and value > hi:
        raise ApiError(400, f"{key}={value} must be <= {hi}", param=key)
    return kind(value)


def _sampling(body: dict, *, default_max: int | None) -> dict[str, Any]:
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", None, kind=int, lo=1)
    else:
        max_tokens = default_max
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 8:
        raise ApiError(400, "stop must be a non-empty string or a list of at most 8 of them", param="stop")
    top_logprobs = _number(body, "top_logprobs", 0, kind=int, lo=0, hi=20)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"seed must be an integer, got {seed!r}", param="seed")
    return dict(
        max_new_tokens=max_tokens,
        n=_number(body, "n", 1, kind=int, lo=1, hi=64),
        stop=stop,
        sampling=SamplingParams(
            temperature=_number(body, "temperature", 1.0, lo=0.0, hi=2.0),
            top_p=_number(body, "top_p", 1.0, lo=0.0, hi=1.0, lo_open=True),
            seed=seed,
            top_logprobs=top_logprobs,
        ),
    )


def _token_entries(tokenizer: Any, ids: list[int], logprobs: list[float], tops: list) -> list[dict]:
    texts = tokenizer.batch_decode([[i] for i in ids])
    out = []
    for j, (t, lp) in enumerate(zip(texts, logprobs)):
        top = []
        if tops:
            alt_texts = tokenizer.batch_decode([[i] for i, _ in tops[j]])
            top = [{"token": s, "logprob": v, "bytes": list(s.encode())} for s, (_, v) in zip(alt_texts, tops[j])]
        out.append({"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": top})
    return out


def create_app(registry: ModelRegistry, *, api_key: str | None = None) -> FastAPI:
    """The FastAPI app serving `registry` (one engine). `api_key`: require ``Bearer <key>``."""
    app = FastAPI(title="groupwise", version="0.1")
    engine = registry.engine
    tokenizer = engine.tokenizer
    app.state.registry = registry

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return exc.response()

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        return ApiError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error").response()

    def check_auth(request: Request) -> None:
        if api_key is not None and request.headers.get("authorization", "") != f"Bearer {api_key}":
            raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                           type="authentication_error", code="invalid_api_key")

    async def read_body(request: Request) -> dict:
        check_auth(request)
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ApiError(400, f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        return body

    def resolve(body: dict):
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ApiError(400, "model is required (a string)", param="model")
        try:
            return registry.resolve(model)
        except ModelNotFoundError as exc:
            raise ApiError(404, str(exc), param="model", code="model_not_found") from exc

    async def run(req: GenerationRequest) -> GenerationResult:
        try:
            future = engine.submit(req)
        except PromptTooLongError as exc:
            raise ApiError(400, str(exc), param="messages", code="context_length_exceeded") from exc
        except EngineError as exc:
            raise ApiError(400, str(exc)) from exc
        return await asyncio.wrap_future(future)

    @app.get("/v1/models")
    async def models(request: Request):
        check_auth(request)
        now = int(time.time())
        return {"object": "list", "data": [
            {"id": m, "object": "model", "created": now, "owned_by": "groupwise"} for m in registry.served_ids()
        ]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await read_body(request)
        target = resolve(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
                raise ApiError(400, f"messages[{i}] needs a role of system, user, assistant or tool", param="messages")
        tools = body.get("tools") or None
        tool_choice = body.get("tool_choice")
        if tools is not None and not isinstance(tools, list):
            raise ApiError(400, "tools must be a list of {type: function, function: {...}}", param="tools")
        try:
            constraint = constraint_for(tokenizer, response_format=body.get("response_format"), tools=tools,
                                        tool_choice=tool_choice)
        except ConstraintError as exc:
            raise ApiError(400, str(exc), param="response_format") from exc
        msgs, template_tools = prepare_messages(messages, tools if tool_choice != "none" else None, tokenizer)
        try:
            prompt_ids = tokenizer.apply_chat_template(msgs, tools=template_tools, add_generation_prompt=True,
                                                       tokenize=True, return_dict=True)["input_ids"]
        except Exception as exc:  # a template may reject a message layout (e.g. roles out of order)
            raise ApiError(400, f"the chat template cannot render these messages: {exc}", param="messages") from exc
        params = _sampling(body, default_max=None)
        parse_tools = bool(tools) and tool_choice != "none"
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        header = {"id": rid, "created": created, "model": target.served_as, "system_fingerprint": target.served_as}
        if body.get("stream"):
            return StreamingResponse(
                _stream_chat(engine, tokenizer, prompt_ids, params, target.adapter, constraint, header,
                             parse_tools, bool(body.get("stream_options", {}) and body["stream_options"].get("include_usage")),
                             run),
                media_type="text/event-stream",
            )
        result = await run(GenerationRequest(prompt_ids, adapter=target.adapter, constraint=constraint, **params))
        choices = []
        for c in result.completions:
            content, calls = parse_tool_calls(c.text) if parse_tools else (c.text, None)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            choices.append({
                "index": c.index,
                "message": message,
                "finish_reason": "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason,
                "logprobs": {"content": _token_entries(tokenizer, c.token_ids, c.logprobs, c.top_logprobs)},
                "token_ids": c.token_ids,
            })
        completion_tokens = sum(len(c.token_ids) for c in result.completions)
        return {**header, "object": "chat.completion", "choices": choices, "usage": {
            "prompt_tokens": result.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": result.prompt_tokens + completion_tokens}}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await read_body(request)
        target = resolve(body)
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise ApiError(400, "prompt must be a non-empty string or a list of token ids", param="prompt")
        if body.get("stream"):
            raise ApiError(400, "stream is not supported on /v1/completions; use /v1/chat/completions", param="stream")
        params = _sampling(body, default_max=16)  # OpenAI's default for completions
        try:
            constraint = constraint_for(tokenizer, response_format=body.get("response_format"))
        except ConstraintError as exc:
            raise ApiError(400, str(exc), param="response_format") from exc
        result = await run(GenerationRequest(prompt_ids, adapter=target.adapter, constraint=constraint, **params))
        choices = []
        for c in result.completions:
            texts = tokenizer.batch_decode([[i] for i in c.token_ids])
            offsets, at = [], 0
            for t in texts:
                offsets.append(at)
                at += len(t)
            choices.append({
                "index": c.index, "text": c.text, "finish_reason": c.finish_reason, "token_ids": c.token_ids,
                "logprobs": {"tokens": texts, "token_logprobs": c.logprobs, "text_offset": offsets,
                             "top_logprobs": [
                                 {tokenizer.decode([i]): v for i, v in top} for top in c.top_logprobs
                             ] if c.top_logprobs else None},
            })
        completion_tokens = sum(len(c.token_ids) for c in result.completions)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": target.served_as, "system_fingerprint": target.served_as, "choices": choices,
                "usage": {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": result.prompt_tokens + completion_tokens}}

    return app


async def _stream_chat(engine, tokenizer, prompt_ids, params, adapter, constraint, header, parse_tools,
                       include_usage, run):
    """SSE chunks: a role delta, text deltas with their logprobs and token ids, a finish chunk.

    With tools the text is held back and sent whole at the end (a tool call must be parsed
    complete); with stop strings, text that could still become a stop string is held back.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def on_token(index: int, token: int, logprob: float, finish: str | None) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (index, token, logprob))

    req = GenerationRequest(prompt_ids, adapter=adapter, constraint=constraint, on_token=on_token, **params)

    def chunk(choices: list[dict], usage: dict | None = None) -> str:
        payload = {**header, "object": "chat.completion.chunk", "choices": choices}
        if usage is not None:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n"

    try:
        task = asyncio.ensure_future(run(req))
        n = req.n
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                     for i in range(n)])
        ids: list[list[int]] = [[] for _ in range(n)]
        sent: list[int] = [0] * n  # characters of text already sent
        hold = max((len(s) for s in req.stop), default=1) - 1
        while not task.done() or not queue.empty():
            get = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                continue
            index, token, logprob = get.result()
            ids[index].append(token)
            delta: dict[str, Any] = {}
            if not parse_tools:
                text = tokenizer.decode(ids[index], skip_special_tokens=True)
                # Send only text that cannot be part of a stop string: up to a stop string found,
                # else all but the last len(longest stop) - 1 characters.
                cuts = [text.find(stop) for stop in req.stop if stop in text]
                safe = min(cuts) if cuts else len(text) - hold
                if text.endswith("\ufffd"):  # an unfinished UTF-8 character: wait for the next token
                    safe = min(safe, len(text) - 1)
                if safe > sent[index]:
                    delta["content"] = text[sent[index]:safe]
                    sent[index] = safe
            entry = _token_entries(tokenizer, [token], [logprob], [])
            yield chunk([{"index": index, "delta": delta, "logprobs": {"content": entry},
                          "token_ids": [token], "finish_reason": None}])
        result = await task
        finals = []
        for c in result.completions:
            delta: dict[str, Any] = {}
            finish = c.finish_reason
            if parse_tools:
                content, calls = parse_tool_calls(c.text)
                if content:
                    delta["content"] = content
                if calls:
                    delta["tool_calls"] = [{**call, "index": k} for k, call in enumerate(calls)]
                    finish = "tool_calls" if finish == "stop" else finish
            elif len(c.text) > sent[c.index]:
                delta["content"] = c.text[sent[c.index]:]
            finals.append({"index": c.index, "delta": delta, "finish_reason": finish})
        yield chunk(finals)
        if include_usage:
            completion_tokens = sum(len(c.token_ids) for c in result.completions)
            yield chunk([], {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": result.prompt_tokens + completion_tokens})
    except ApiError as exc:
        yield f"data: {json.dumps({'error': {'message': exc.message, 'type': exc.type, 'param': exc.param, 'code': exc.code}})}\n\n"
    except Exception as exc:  # mid-stream the status is already 200: report in-band, like OpenAI
        yield f"data: {json.dumps({'error': {'message': f'{type(exc).__name__}: {exc}', 'type': 'server_error', 'param': None, 'code': None}})}\n\n"
    yield "data: [DONE]\n\n"


def run_serve(args) -> int:
    """`groupwise serve`: load the base model and adapters, serve over HTTP with uvicorn."""
    import ipaddress
    import os

    import uvicorn

    from groupwise.errors import ConfigError
    from groupwise.inference.engine import Engine
    from groupwise.loading import load_base_model

    problems = []
    loopback = args.host in ("localhost",)
    try:
        loopback = loopback or ipaddress.ip_address(args.host).is_loopback
    except ValueError:
        pass
    if not loopback and not args.api_key:
        problems.append(f"--host {args.host} is not a loopback address: anyone on the network could use the "
                        "model, so --api-key KEY is required")
    for path in args.adapter:
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            problems.append(f"--adapter {path}: no adapter_config.json there (expected a peft LoRA folder)")
    if problems:
        raise ConfigError(problems, what="serve arguments")
    from groupwise.compute import compute_thread

    # loaded on the thread that will run the engine (groupwise/compute.py: one OpenMP team)
    model, tokenizer = compute_thread().call(load_base_model, args.model, device=args.device, dtype=args.dtype)
    engine = Engine(model, tokenizer, max_batch_size=getattr(args, "max_batch_size", 32))
    name = args.name or args.model
    registry = ModelRegistry(engine, base_name=args.model)
    if name != args.model:
        registry.register_model(name)  # served as name (latest step), name@0 (base), name@<step>
    for path in args.adapter:
        folder = os.path.basename(os.path.normpath(path))
        if folder.isdigit() and name != args.model:
            served = registry.add_step(name, int(folder), path)
        else:
            registry.add_alias(folder, path)
            served = folder
        print(f"serving adapter {path} as {served!r}")
    print(f"serving {registry.served_ids()} on http://{args.host}:{args.port}/v1")
    app = create_app(registry, api_key=args.api_key)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        engine.close()
    return 0
