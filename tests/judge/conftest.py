"""The `judge_server` fixture: a scripted judge (tests/judge/judge_helpers.py) served over real HTTP.

Helpers live in judge_helpers.py, not here: test modules import them by a module name no other test
folder uses (every folder's conftest is a module named ``conftest``, so ``from conftest import ...``
picked whichever folder pytest collected first).
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from judge_helpers import ScriptedJudge


@pytest.fixture
def judge_server():
    import uvicorn

    judge = ScriptedJudge()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(judge.app(), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("scripted judge server did not start within 10 s")
        time.sleep(0.01)
    judge.url = f"http://127.0.0.1:{port}/v1"
    yield judge
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
