"""Fixtures of the env tests: the email env's inbox database, a scripted OpenAI-compatible endpoint for
rollout tests (the real `openai.AsyncOpenAI`, with an httpx MockTransport at the HTTP seam, answering each
request with the next scripted reply), and two GRPO steps of an env spec (the verifiers cases, which run in
environments of their own, read it from here too)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI


class ScriptedModel:
    """Has what a rollout uses: `name`, `inference_name()`, `openai_client()`.

    Each reply is a string (the assistant's content), a dict ``{"tool_calls": [(name, args), ...]}`` for a
    native tool call, or ``{"cut": text}`` (content that max_tokens cut: finish_reason "length"). Every
    request body is kept in `requests`.
    """

    def __init__(self, replies: list[Any] | Callable[[dict], Any], name: str = "scripted-agent"):
        self.name = name
        self._replies = replies
        self.requests: list[dict] = []

    def inference_name(self) -> str:
        return f"{self.name}@0"

    def _next(self, body: dict) -> Any:
        if callable(self._replies):
            return self._replies(body)
        if not self._replies:
            raise AssertionError("the rollout asked for more replies than the test scripted")
        return self._replies.pop(0)

    def _handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        reply = self._next(body)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "tool_calls" if isinstance(reply, dict) else "stop"
        if isinstance(reply, dict) and "cut" in reply:  # {"cut": text}: a reply stopped by max_tokens
            reply, finish = reply["cut"], "length"
        if isinstance(reply, dict):
            message["tool_calls"] = [
                {"id": f"call_{len(self.requests)}_{i}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args)}}
                for i, (name, args) in enumerate(reply["tool_calls"])
            ]
            text = ""
        else:
            message["content"] = text = reply
        # one fake token per character: enough to check the ids and logprobs survive to the Choice
        tokens = list(text) or ["<tc>"]
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "logprobs": {"content": [{"token": t, "logprob": -0.25, "bytes": None, "top_logprobs": []} for t in tokens]},
            "token_ids": list(range(100, 100 + len(tokens))),
        }
        # JSON with ASCII escapes, as many servers write it: a reply may then hold a lone surrogate
        # ("\ud800"), which the openai client parses into the Choice's text.
        return httpx.Response(200, headers={"content-type": "application/json"}, content=json.dumps({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 0,
            "model": body["model"], "choices": [choice],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(tokens), "total_tokens": 1 + len(tokens)},
        }))

    def openai_client(self) -> AsyncOpenAI:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self._handle))
        return AsyncOpenAI(base_url="http://scripted.test/v1", api_key="test", http_client=http, max_retries=0)


@pytest.fixture
def scripted():
    return ScriptedModel


@pytest.fixture(scope="session")
def db(tmp_path_factory) -> str:
    """The email env's SQLite inbox database of corpus 0 (the tools only read it)."""
    from groupwise.envs.email_search.inbox import build_database, generate_corpus

    return str(build_database(tmp_path_factory.mktemp("email") / "inbox.sqlite", generate_corpus(0)))


async def _fit_two_steps(model_dir: str, tmp_path: Any, spec: Any, name: str, max_tokens: int) -> tuple[list, Any]:
    """One greedy rollout of the untrained model on a validation scenario (what the env did, deterministic),
    then two GRPO steps of gw.fit on the training scenarios; the history's train rows and that trajectory."""
    import groupwise as gw
    from groupwise.runs.series import rows

    model = gw.TrainableModel(name=name, project="envs", base_model=model_dir)
    backend = gw.LocalBackend(path=str(tmp_path), best_checkpoint_metric=None)
    await model.register(backend)
    train, val, _ = spec.scenarios(0, max_tokens=max_tokens)
    config = gw.LoopConfig(rollouts_per_group=2, groups_per_step=2, max_steps=2, eval_every=100, patience=10,
                           resample_no_signal=0)
    try:
        trajectory = await spec.rollout(model, val[0].model_copy(update={"temperature": 0.0}))
        summary = await gw.fit(model, spec.rollout, train, config=config)
    finally:
        await backend.close()
    assert summary.final_step == 2
    steps = rows(gw.load_history(summary.run_dir), "train")
    assert [r["step"] for r in steps] == [0, 1] and any(r["skipped"] == 0.0 for r in steps)  # a gradient step
    return steps, trajectory


@pytest.fixture
def fit_two_steps():
    return _fit_two_steps
