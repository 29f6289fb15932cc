"""An env's server started as its users start it (``uvicorn <module>:app``), for the tests of the OpenEnv envs."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


@contextlib.contextmanager
def uvicorn_app(app: str, log: Path, app_dir: Path = Path(__file__).parent) -> Iterator[str]:
    """Serve `app` (``package.module:app`` under `app_dir`) on a free loopback port; yields its URL once
    ``/health`` answers, and stops it after (uvicorn waits for open sessions to close: a failed test may
    leave some, so it is killed after 30 s)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                                "--app-dir", str(app_dir)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise AssertionError(f"the server of {app} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
