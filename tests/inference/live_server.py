"""A FastAPI app served by uvicorn on loopback inside a test process."""

from __future__ import annotations


class LiveServer:
    """An app served by uvicorn on a free loopback port, in a thread of this process (so a test can
    count the engine's work or patch the app while real HTTP clients talk to it)."""

    def __init__(self, app, **config):
        import threading

        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **config))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.clients: list = []

    def __enter__(self) -> "LiveServer":
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    async def __aenter__(self) -> "LiveServer":
        return self.__enter__()

    async def __aexit__(self, *exc) -> None:
        for c in self.clients:  # closed on this loop (a client collected later would close on a dead one)
            await c.close()
        self.__exit__(*exc)

    def client(self, **kwargs):
        """A real `openai.AsyncOpenAI` for this server (closed when the server stops)."""
        import openai

        c = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=kwargs.pop("api_key", "unused"), **kwargs)
        self.clients.append(c)
        return c
