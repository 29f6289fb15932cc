"""A scripted judge: a real HTTP server speaking the OpenAI chat API (FastAPI + uvicorn on 127.0.0.1);
conftest.py serves it as the `judge_server` fixture.

The test scripts its answers; the judge code talks to it through the `openai` SDK exactly as it
would talk to OpenAI. By default it answers like an honest judge: each trajectory's score is the
number written as ``quality=0.xx`` in that trajectory's block, and it lists the entries in REVERSE
id order, so a client that maps by position instead of by id gets wrong scores.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

TRAJ_RE = re.compile(r'<trajectory id="([^"]+)">\n(.*?)\n</trajectory>', re.DOTALL)
QUALITY_RE = re.compile(r"quality=([0-9.]+)")


@dataclass
class Reply:
    content: str | None = None
    status: int = 200
    delay: float = 0.0
    prompt_tokens: int = 1000
    completion_tokens: int = 200


def shown_trajectories(request: dict[str, Any]) -> list[tuple[str, str]]:
    """(id, block text) of every trajectory in a judge request, in the order shown."""
    user = request["messages"][1]["content"]
    return TRAJ_RE.findall(user)


def quality_of(block: str) -> float:
    m = QUALITY_RE.findall(block)
    return float(m[-1]) if m else 0.5


def answer(entries: list[tuple[str, float]], reverse: bool = True) -> str:
    items = [{"trajectory_id": t, "explanation": f"looks like {s:.2f}", "score": s} for t, s in entries]
    if reverse:
        items = items[::-1]
    return json.dumps({"scores": items})


def honest(request: dict[str, Any]) -> Reply:
    return Reply(answer([(t, quality_of(b)) for t, b in shown_trajectories(request)]))


class ScriptedJudge:
    """Holds the requests received and a queue of scripted replies (then `default` for the rest)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each request's HTTP headers (Authorization, ...)
        self.script: deque[Reply | Callable[[dict[str, Any]], Reply]] = deque()
        self.default: Callable[[dict[str, Any]], Reply] = honest
        self.url = ""

    def then(self, **reply: Any) -> None:
        """Script the next reply (`Reply`'s fields), for test modules that do not import judge_helpers."""
        self.script.append(Reply(**reply))

    def app(self):
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            body = await request.json()
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            step = self.script.popleft() if self.script else self.default
            reply = step(body) if callable(step) else step
            if reply.delay:
                await asyncio.sleep(reply.delay)
            if reply.status != 200:
                return JSONResponse({"error": {"message": f"scripted {reply.status}"}}, status_code=reply.status)
            return {
                "id": f"cmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 0,
                "model": body.get("model", "scripted"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": reply.content}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": reply.prompt_tokens,
                    "completion_tokens": reply.completion_tokens,
                    "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                },
            }

        return app
