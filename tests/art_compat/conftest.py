"""Fixtures of the ART drop-in tests: the tiny random Llama with end tokens that make its answers end
(LocalBackend loads it as it would a Hugging Face id), and a folder standing in for ART's BACKUP_BUCKET."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request


@pytest.fixture(scope="session")
def art_model_dir(tmp_path_factory):
    """The stand-in for every base model of ART's example programs: the tiny random model, whose
    generation config also ends an answer at one token id in 40. A random model otherwise writes until
    the context is full whenever a program sets no `max_tokens`, which no real model does on these
    prompts; with these end tokens its answers average ~60 tokens."""
    from groupwise.runtime.loading import load_tokenizer, tiny_random_model

    path = tmp_path_factory.mktemp("tiny-llama-ends")
    tokenizer = load_tokenizer("smollm2-135m")
    model, tokenizer = tiny_random_model(seed=0, tokenizer=tokenizer)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *range(0, len(tokenizer), 40)]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def answering_model_dir(path, words: dict[str, float]) -> str:
    """A tiny random model that answers with `words` (text -> logit; the other ~49k tokens sit near 0),
    in any context: the stand-in for a real model on a task whose reward a random model never earns
    (ART's yes/no/maybe pipeline example). Every token's embedding carries one constant feature through
    the residual stream; the (untied) LM head reads only that feature, and only for `words`."""
    import torch

    from groupwise.runtime.loading import load_tokenizer, tiny_random_model

    model, tokenizer = tiny_random_model(seed=0, tokenizer=load_tokenizer("smollm2-135m"))
    with torch.no_grad():
        embeddings = model.model.embed_tokens.weight
        head = torch.zeros_like(embeddings)
        embeddings[:, 0] = 50.0  # dominates the residual stream: after the final norm, ~sqrt(hidden) * w_0
        for word, logit in words.items():
            (token,) = tokenizer.encode(word, add_special_tokens=False)
            head[token, 0] = logit / model.config.hidden_size ** 0.5
        model.config.tie_word_embeddings = False
        model.lm_head.weight = torch.nn.Parameter(head)
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, *range(0, len(tokenizer), 40)]
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def yes_no_maybe_model_dir(tmp_path_factory):
    return answering_model_dir(tmp_path_factory.mktemp("tiny-yes-no-maybe"), {" maybe": 12.0, " no": 12.0, " yes": 12.0})


@pytest.fixture(scope="session")
def binary_guess_model_dir(tmp_path_factory):
    # bits, the opening quote (with its space) of the JSON string, a closing quote now and then
    return answering_model_dir(tmp_path_factory.mktemp("tiny-bits"), {"0": 15.0, "1": 15.0, '"': 13.0, ' "': 15.0})


@pytest.fixture
def backup_bucket(tmp_path, monkeypatch):
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    monkeypatch.setenv("BACKUP_BUCKET", str(bucket))
    return bucket


def serve_in_thread(app):
    """Serve a FastAPI app with uvicorn on a free loopback port in a daemon thread; returns (base_url, stop)."""
    import socket
    import threading
    import time

    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the stub server did not start"
        time.sleep(0.01)

    def stop():
        server.should_exit = True
        thread.join(10)
        sock.close()

    return f"http://127.0.0.1:{sock.getsockname()[1]}/v1", stop


class StubJudge:
    """An OpenAI-compatible chat endpoint that answers RULER's prompt: each shown trajectory scores the
    length of its text mod 7 / 6 (so scores differ), or 0.5 for all while `tie` is set. It records the
    requests (model, Authorization header) so tests can check what a provider prefix sent where."""

    def __init__(self) -> None:
        import re

        self.tie = False
        self.fail = False
        self.requests: list[dict] = []
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def complete(request: Request):
            import json

            body = await request.json()
            self.requests.append({"model": body["model"], "auth": request.headers.get("authorization")})
            if self.fail:
                from fastapi.responses import JSONResponse

                return JSONResponse({"error": {"message": "judge overloaded", "type": "server_error"}}, status_code=400)
            prompt = body["messages"][-1]["content"]
            blocks = re.findall(r'<trajectory id="(\d+)">(.*?)</trajectory>', prompt, flags=re.S)
            scores = [{"trajectory_id": tid, "explanation": "stub",
                       "score": 0.5 if self.tie else (len(text) % 7) / 6} for tid, text in blocks]
            return {
                "id": "stub", "object": "chat.completion", "created": 0, "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": json.dumps({"scores": scores})}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }

        self.app = app


@pytest.fixture
def stub_judge():
    judge = StubJudge()
    url, stop = serve_in_thread(judge.app)
    judge.base_url = url
    yield judge
    stop()


@pytest.fixture(autouse=True)
def fresh_compat_warnings(monkeypatch):
    """ArtCompatWarning is given once per process; each test here starts as a fresh process would."""
    from groupwise import errors

    monkeypatch.setattr(errors, "_warned", set())  # where warn_ignored keeps them
