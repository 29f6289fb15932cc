"""verifiers 0.4's ``verifiers.v1`` stack (tasksets, harnesses, envs) as an `EnvSpec` for `gw.fit`.

A v1 environment is a ``Taskset`` of ``Task``s (each a ``TaskData`` row with ``@vf.reward``/``@vf.metric``/
``@vf.stop`` hooks and optional ``Toolset``s) played by an ``Env``'s agents; an agent is a harness (the
program the model runs in, e.g. the tool-less chat loop ``null`` or ``bash``) in a runtime (a local
subprocess, a container, a remote sandbox). The model never sees the env directly: the harness talks to
v1's interception server, which records the ``Trace`` and forwards each model call to the run's
endpoint. This module runs that machinery as it is (``env.serving()``, ``env.run_episode(task, ctx)``)
with the endpoint pointed at a small recording endpoint of its own, which sends each call through
``model.openai_client()`` and keeps the ``Choice`` groupwise's server returned (token ids and logprobs,
which v1's eval client drops), answering the harness as JSON or, when it streams, as one SSE chunk.

What comes back: the trace's weighted reward (``trace.reward``, the sum of its ``@vf.reward`` scores
times their weights) is the trajectory's reward; each reward's score and each ``@vf.metric`` is a
metric; the recorded calls of each trainable trace are its conversations. A failed episode (v1 records
errors on the episode and its traces rather than raising) is raised as `EnvError`.

Not driven: agents in remote runtimes (``prime``, ``modal``, ``e2b``: a tunnel and a provider account);
harnesses that speak the Responses or Anthropic Messages API (codex, claude_code: the recording endpoint
serves chat completions only, and those harnesses need containers anyway); several trainable agents in
one episode.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import random
import secrets
import weakref
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from groupwise.core.choices import wants_compact_token_data
from groupwise.core.trajectory import Trajectory
from groupwise.envs._chat import TURN_SEED_STRIDE, Sampling, conversations, inference_name, number_or_none
from groupwise.envs.spec import EnvSpec
from groupwise.errors import ArgumentTypeError, EnvError, MissingDependencyError

SESSION_HEADER = "X-Session-ID"  # v1's eval client sends the trace id with every call it forwards
REMOTE = "agents in remote runtimes (prime, modal, e2b sandboxes)"


class VerifiersTaskScenario(Sampling):
    """One task of a v1 taskset (by its position in the taskset), with the sampling settings of its rollout."""

    index: int = Field(description="The task's position in the env's taskset.")
    key: str | None = Field(None, description="The task's stable key (Task.key).")
    prompt: str = Field("", description="The task's prompt text, for reading runs.")
    split: str = Field("train", description="Which split the task is in (train, val or test).")


def _v1() -> Any:
    try:
        return importlib.import_module("verifiers.v1")
    except ImportError as exc:
        if getattr(exc, "name", None) in ("verifiers", "verifiers.v1", None):
            raise MissingDependencyError("gw.envs.from_verifiers (verifiers 0.4)", "verifiers", "verifiers") from exc
        raise


def is_v1(obj: Any) -> bool:
    """Whether `obj` (an instance or a class) is of verifiers' v1 stack."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any((c.__module__ or "").startswith("verifiers.v1.") for c in cls.__mro__)


def v1_taskset_module(module: Any) -> bool:
    """Whether an imported module is a v1 taskset plugin (it exports a ``vf.Taskset`` subclass in ``__all__``)."""
    names = getattr(module, "__all__", None) or []
    return any(isinstance(getattr(module, n, None), type) and is_v1(getattr(module, n)) for n in names)


def environment(taskset: Any, *, harness: str | None = None) -> Any:
    """The v1 ``Env`` that plays `taskset` (a taskset id: the module exporting it; a ``vf.Taskset`` class or
    instance) with one agent in the local subprocess runtime: the taskset's own env class if its package
    exports one, else ``SingleAgentEnv``. The harness is `harness`, else the taskset's bundled harness,
    else ``null`` (the chat loop with the taskset's tools and no shell: v1's own default, ``bash``, would
    run the policy's commands on the training host)."""
    vf = _v1()
    # v1 loads a taskset by id, the package that exports it (its class's top-level package)
    if isinstance(taskset, str):
        config = vf.TasksetConfig(id=taskset)
    elif isinstance(taskset, type):
        config = vf.TasksetConfig(id=taskset.__module__.split(".")[0])
    else:
        config = taskset.config
        if not config.id:
            config = config.model_copy(update={"id": type(taskset).__module__.split(".")[0]})
    ident = harness or (config.id if vf.default_harness_id(config.id) == config.id else "null")
    agent = vf.AgentConfig(harness=vf.harness_config_type(ident).model_validate({"id": ident}),
                           runtime=vf.SubprocessConfig())
    return vf.load_environment(vf.resolve_env_config({"taskset": config.model_dump(), "agent": agent.model_dump()}))


def _check_local(env: Any) -> None:
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.runtimes import runtime_is_local

    for name, agent in agent_config_fields(env.config).items():
        if not runtime_is_local(agent.runtime):
            raise EnvError(
                f"the v1 env's agent {name!r} runs in the {agent.runtime.type!r} runtime, a remote sandbox: "
                f"gw.envs.from_verifiers does not drive {REMOTE}. Run it in the local subprocess runtime "
                f"(vf.AgentConfig(runtime=vf.SubprocessConfig()), or --env.{name}.runtime.type subprocess), or "
                "pass the taskset and gw.envs.from_verifiers builds that env.")


@dataclass
class _Rollout:
    """One rollout's route on the recording endpoint: how to call the model, and the calls it made."""

    client: Any
    model: str
    seed: int | None
    logprobs: bool
    calls: list[tuple[str, list[Any], Any, Any]] = field(default_factory=list)  # (trace id, messages, tools, Choice)


def _sse(payload: dict[str, Any]) -> bytes:
    """A whole completion as a chat stream: one chunk with the message, one with the usage."""
    choice = payload["choices"][0]
    message = {k: v for k, v in (choice.get("message") or {}).items() if v is not None}
    if message.get("tool_calls"):
        message["tool_calls"] = [{**call, "index": i} for i, call in enumerate(message["tool_calls"])]
    head = {k: v for k, v in payload.items() if k not in ("choices", "usage")}
    chunks = [{**head, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": message, "finish_reason": choice.get("finish_reason")}]}]
    if payload.get("usage"):
        chunks.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": payload["usage"]})
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


class _Endpoint:
    """The recording endpoint and the env's serving resources, for one event loop. Held while any rollout
    runs (counted), and served by a task of its own: v1's ``serving()`` (MCP tool servers, the interception
    server) is entered and left in that one task."""

    def __init__(self, env: Any):
        self.env, self.count, self.lock = env, 0, asyncio.Lock()
        self.rollouts: dict[str, _Rollout] = {}
        self.base_url = ""
        self.task: asyncio.Task | None = None
        self.stop = asyncio.Event()

    async def chat(self, request: Any) -> Any:
        from aiohttp import web
        import openai

        rollout = self.rollouts.get(request.match_info["token"])
        if rollout is None:
            return web.json_response({"error": {"message": "no rollout on this route (it has ended)"}}, status=404)
        body = await request.json()
        stream = bool(body.pop("stream", False))
        body.pop("stream_options", None)
        session = request.headers.get(SESSION_HEADER, "")
        messages, tools = body.pop("messages"), body.get("tools")
        body.pop("model", None)
        turn = sum(1 for call in rollout.calls if call[0] == session)
        if rollout.seed is not None:
            body["seed"] = rollout.seed + TURN_SEED_STRIDE * turn
        if rollout.logprobs:
            body["logprobs"] = True
        try:
            completion = await rollout.client.chat.completions.create(model=rollout.model, messages=messages,
                                                                      extra_body=body)
        except openai.APIStatusError as exc:
            return web.json_response(exc.body if isinstance(exc.body, dict) else {"error": {"message": str(exc)}},
                                     status=exc.status_code)
        except openai.APIError as exc:
            return web.json_response({"error": {"message": str(exc)}}, status=502)
        if completion.choices:
            rollout.calls.append((session, messages, tools, completion.choices[0]))
        payload = completion.model_dump(mode="json")
        if stream:
            return web.Response(body=_sse(payload), content_type="text/event-stream")
        return web.json_response(payload)

    async def other(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"error": {"message": (
            f"{request.path}: groupwise records chat completions only; a harness that speaks another API "
            "(Responses, Anthropic Messages) is not driven by gw.envs.from_verifiers")}}, status=404)

    async def _serve(self, ready: asyncio.Future) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{token}/v1/chat/completions", self.chat)
        app.router.add_route("*", "/{tail:.*}", self.other)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            self.base_url = f"http://127.0.0.1:{port}"
            async with self.env.serving():
                ready.set_result(None)
                await self.stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.cancel() if isinstance(exc, asyncio.CancelledError) else ready.set_exception(exc)
            raise
        finally:
            await runner.cleanup()

    async def acquire(self) -> None:
        async with self.lock:
            if self.count == 0:
                self.stop = asyncio.Event()
                ready = asyncio.get_running_loop().create_future()
                self.task = asyncio.create_task(self._serve(ready), name="groupwise-verifiers-v1-serving")
                try:
                    await ready
                except BaseException:  # it failed to start, or this rollout was cancelled while it started
                    self.stop.set()
                    task, self.task = self.task, None
                    await asyncio.gather(task, return_exceptions=True)
                    raise
            self.count += 1

    async def release(self) -> None:
        async with self.lock:
            self.count -= 1
            if self.count == 0 and self.task is not None:
                self.stop.set()
                task, self.task = self.task, None
                await task


def _failure(episode: Any) -> str | None:
    errors = list(episode.errors) + [e for trace in episode.traces for e in trace.errors]
    if episode.ok and not errors:
        return None
    return "; ".join(f"{e.type}: {e.message}" for e in errors) or "the episode did not complete"


def make_rollout(env: Any, tasks: list[Any], *, sampling_args: dict[str, Any] | None = None) -> Any:
    """``async rollout(model, scenario) -> Trajectory`` running one v1 episode of the scenario's task."""
    vf = _v1()
    endpoints: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    extra = dict(sampling_args or {})

    async def rollout(model: Any, scenario: VerifiersTaskScenario) -> Trajectory:
        if not isinstance(scenario, VerifiersTaskScenario):
            raise ArgumentTypeError(f"a verifiers v1 rollout takes a VerifiersTaskScenario (from spec.scenarios), "
                                    f"got {type(scenario).__name__}")
        loop = asyncio.get_running_loop()
        endpoint = endpoints.get(loop)
        if endpoint is None:
            endpoint = endpoints[loop] = _Endpoint(env)
        client = model.openai_client()
        logprobs = scenario.logprobs and not wants_compact_token_data(getattr(client, "default_headers", None) or {})
        token = secrets.token_hex(12)
        route = _Rollout(client=client, model=inference_name(model), seed=scenario.sampling_seed, logprobs=logprobs)
        sampling = vf.SamplingConfig(**{**extra, "max_tokens": scenario.max_tokens,
                                        "temperature": scenario.temperature})
        await endpoint.acquire()
        try:
            endpoint.rollouts[token] = route
            ctx = vf.ModelContext(model=route.model, sampling=sampling, client=vf.EvalClientConfig(
                base_url=f"{endpoint.base_url}/{token}/v1", api_key_var="GROUPWISE_VERIFIERS_UNUSED_KEY"))
            episode = await env.run_episode(tasks[scenario.index], ctx)
        finally:
            endpoint.rollouts.pop(token, None)
            await endpoint.release()
        failure = _failure(episode)
        if failure is not None:  # v1 keeps a failed episode's errors on it; training on it would hide them
            raise EnvError(f"the verifiers v1 episode failed: {failure}")
        traces = [t for t in episode.traces if t.agent.trainable]
        if len(traces) != 1:
            raise EnvError(f"the v1 episode has {len(traces)} trainable traces; gw.envs.from_verifiers trains one "
                           "agent per episode (mark the others `trainable = False` in the env's setup())")
        trace = traces[0]
        calls = [(messages, tools, choice) for session, messages, tools, choice in route.calls if session == trace.id]
        if not calls:
            raise EnvError("the v1 episode ended without asking the model anything; nothing to train")
        first, *more = conversations(calls)
        metrics: dict[str, float] = {}
        for name, reward in trace.rewards.items():
            if reward is not None:
                metrics[name] = float(reward.score)
        for name, value in trace.metrics.items():
            number = number_or_none(value)
            if number is not None:
                metrics[name] = number
        metrics["turns"] = float(len(calls))
        metrics["truncated"] = float(bool(trace.is_truncated or trace.is_timeout))
        return Trajectory(messages_and_choices=first.messages_and_choices, tools=first.tools,
                          additional_histories=more, reward=float(trace.reward), metrics=metrics,
                          metadata={"stop_condition": str(trace.stop_condition or "")})

    return rollout


def from_v1(env: Any, *, name: str | None, max_tokens: int | None, val_size: int, test_size: int,
            sampling_args: dict[str, Any] | None, judge: str | None, num_tasks: int | None) -> EnvSpec:
    """`gw.envs.from_verifiers` for a v1 ``Env``, ``Taskset`` (class or instance) (module doc); every setting
    is `from_verifiers`'s, which owns their defaults."""
    vf = _v1()
    if judge is not None:
        raise EnvError("judge= re-points a classic JudgeRubric; a v1 task's judge is its own vf.JudgeConfig "
                       "(model, client base_url): set it on the taskset's TaskConfig, e.g. a served model's URL")
    if not isinstance(env, vf.Env):
        if not isinstance(env, vf.Taskset) and not (isinstance(env, type) and issubclass(env, vf.Taskset)):
            raise ArgumentTypeError(f"gw.envs.from_verifiers takes a v1 vf.Env or vf.Taskset, got {type(env).__name__}")
        env = environment(env)
    _check_local(env)
    taskset = env.taskset if num_tasks is None else env.taskset.take(num_tasks)
    if not taskset.bounded:
        raise EnvError("the v1 taskset is infinite (INFINITE = True): pass num_tasks= to train on its first N")
    tasks = list(taskset)
    if len(tasks) < 2:
        raise EnvError(f"the v1 taskset has {len(tasks)} tasks: training needs some, and validation a few more")
    held = min(val_size + test_size, len(tasks) // 2)  # held out from the end, never trained on
    n_val = min(val_size, held - min(test_size, held // 2))
    train_ix = list(range(len(tasks) - held))
    val_ix, test_ix = list(range(len(train_ix), len(train_ix) + n_val)), list(range(len(train_ix) + n_val, len(tasks)))
    tokens = max_tokens or (sampling_args or {}).get("max_tokens") or 256

    def scenarios(seed: int, **overrides: Any) -> tuple[list[Any], list[Any], list[Any]]:
        def make(indices: list[int], split: str) -> list[VerifiersTaskScenario]:
            settings = {"max_tokens": tokens, **overrides}
            return [VerifiersTaskScenario(index=i, key=tasks[i].key, prompt=str(tasks[i].data.prompt_text or ""),
                                          split=split, **settings) for i in indices]

        train = make(train_ix, "train")
        random.Random(f"verifiers:{seed}").shuffle(train)
        return train, make(val_ix, "val"), make(test_ix, "test")

    env_id = env.config.taskset.id or type(env.taskset).__name__
    return EnvSpec(
        name=name or f"verifiers:{env_id}",
        description=f"verifiers v1 taskset {env_id} ({type(env).__name__}), rewarded by its tasks' rewards",
        rollout=make_rollout(env, tasks, sampling_args={k: v for k, v in (sampling_args or {}).items()
                                                        if k != "max_tokens"}),
        scenarios=scenarios,
        validate=lambda trajectory: trajectory.reward,
        val_metric="rubric_reward",
        reward="verifiable",
    )


__all__ = ["REMOTE", "VerifiersTaskScenario", "environment", "from_v1", "is_v1", "make_rollout",
           "v1_taskset_module"]
