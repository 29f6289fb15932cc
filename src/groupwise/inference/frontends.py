"""`groupwise serve --frontends K`: one engine core process and K frontend processes on one host:port.

Why. On a GPU the per-request Python (HTTP, chat template, tokenising, responses) bounds tokens/s, and one
process runs all of it under one GIL; the engine core (engine_core.py) lets several processes share it:
measured on an H200 at 256 concurrent chats, 2 frontends made 1.63x and 4 made 1.98x of the in-process
app (engine_core.resolve_engine_process).

How. The serve process, the supervisor, starts the core (it owns it: engine_client.start_engine_core),
loads the ``--adapter`` folders into it, and starts K processes of ``python -m
groupwise.inference.frontends``, each reading a `FrontendSpec` on stdin (the API key never appears on a
command line). Each frontend connects to the core with its own `EngineCoreClient`, builds the same app
(server.create_app: the Host/Origin guard and the key in every process) over a `CoreRegistry` (the served
names derived from the core's adapter set, the one record of it), and serves it with uvicorn on its own
listening socket bound with SO_REUSEPORT: the kernel spreads new connections over the K sockets by a hash
of their addresses, so nothing of ours balances or forwards requests. Only processes of the same user may
join a SO_REUSEPORT port (Linux's rule); the supervisor binds the port first, so a port already taken
fails at start.

Lifecycle. SIGINT or SIGTERM of the supervisor stops every frontend (SIGTERM: uvicorn's graceful
shutdown, at most `GRACE_S` for requests in flight), then the core. A frontend that dies (SIGKILL
included) is replaced by a new one; the core frees the dead one's requests and the others go on serving.
One that keeps dying (more than `RESTARTS` times a minute) stops the server with its exit, and one that
exits before it ever served is not restarted: the command fails with its exit (a setting that
cannot serve must not loop). When the core dies, every frontend answers 503 naming its exit
(engine_client.EngineProcessDied) and the supervisor stops them and fails. A supervisor killed outright
leaves nothing: the core and each frontend watch its pid and exit.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import msgspec

from groupwise.errors import GroupwiseError
from groupwise.inference.engine_core import LIVENESS_S, pid_exit

__all__ = ["GRACE_S", "FrontendSpec", "FrontendsFailed", "RestartBudget", "bind_port", "serve_frontends"]

GRACE_S = 5.0  # what a stopping frontend gives its requests in flight before it closes their connections
READY_TIMEOUT_S = 300.0  # a frontend's start (imports, tokenizer, its first connection to the core)
RESTARTS = 5  # replacements of one frontend within RESTART_WINDOW_S that the server makes before it stops
RESTART_WINDOW_S = 60.0


class FrontendsFailed(GroupwiseError):
    """A frontend could not start, or the engine core died: the server cannot go on (the message says why)."""


class RestartBudget:
    """How often one frontend may be replaced: `limit` times within `window_s` seconds. A frontend killed
    now and then (the OOM killer, an operator) is replaced; one that dies again at once (a bug its
    requests hit, memory that never suffices) would otherwise be restarted forever, its log scrolling
    past while the server answers from fewer processes, so past the budget the server stops and says so."""

    def __init__(self, limit: int = RESTARTS, window_s: float = RESTART_WINDOW_S, clock: Any = time.monotonic):
        self.limit, self.window_s, self._clock = limit, window_s, clock
        self._times: list[float] = []

    def spend(self) -> bool:
        """Take one restart; False when `limit` were already taken within the last `window_s` seconds."""
        now = self._clock()
        self._times = [t for t in self._times if now - t < self.window_s]
        if len(self._times) >= self.limit:
            return False
        self._times.append(now)
        return True


class FrontendSpec(msgspec.Struct):
    """What one frontend serves: the core it feeds, the names, the HTTP settings of `groupwise serve`."""

    core: str  # the core's address (engine_client.new_core_address)
    tokenizer: str  # the model whose tokenizer the frontend loads
    base_name: str
    name: str | None
    host: str
    port: int
    api_key: str | None
    allowed_hosts: list[str]
    max_body_bytes: int
    lora_routes: bool
    supervisor_pid: int
    ready_fd: int  # written once the app serves


def bind_port(host: str, port: int, *, shared: bool = True) -> socket.socket:
    """A TCP socket bound to host:port, not listening; `shared`: with SO_REUSEPORT (the frontends' group:
    module doc), else alone (which fails while any socket holds the port, a shared one included)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise FrontendsFailed(f"cannot listen on {host}:{port} ({exc.strerror}); another server may hold it: "
                              "stop it or pass another --port") from None
    return sock


# ------------------------------------------------------------------------------------ a frontend process


def run_frontend(spec: FrontendSpec) -> None:
    """Connect to the core, build the app, serve it on host:port until SIGTERM or the supervisor's end."""
    import uvicorn

    from groupwise.inference.engine_client import connect_engine_core
    from groupwise.inference.registry import CoreRegistry
    from groupwise.inference.connections import uvicorn_config
    from groupwise.inference.server import create_app
    from groupwise.runtime.loading import load_tokenizer

    _watch_supervisor(spec.supervisor_pid)
    engine = connect_engine_core(spec.core, load_tokenizer(spec.tokenizer))
    try:
        registry = CoreRegistry(engine, spec.base_name, spec.name)
        routers = []
        if spec.lora_routes:
            from groupwise.inference.adapter_routes import lora_routes

            routers.append(lora_routes)
        app = create_app(registry, api_key=spec.api_key, max_body_bytes=spec.max_body_bytes,
                         allowed_hosts=spec.allowed_hosts, bound_host=spec.host, routers=routers)
        sock = bind_port(spec.host, spec.port)

        class Server(uvicorn.Server):
            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                if self.started:  # listening: the supervisor may say the server is up
                    os.write(spec.ready_fd, b"1")
                    os.close(spec.ready_fd)

        Server(uvicorn_config(app, spec.host, spec.port, timeout_graceful_shutdown=GRACE_S)).run(sockets=[sock])
    finally:
        engine.close()


def _watch_supervisor(pid: int) -> None:
    """Stop this frontend when the supervisor is gone (killed outright: nobody else would stop it)."""

    def watch() -> None:
        while pid_exit(pid)[0]:
            time.sleep(LIVENESS_S)
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown
        time.sleep(GRACE_S + 1.0)
        os._exit(1)

    threading.Thread(target=watch, name="groupwise-supervisor-watch", daemon=True).start()


def main() -> None:
    run_frontend(msgspec.msgpack.decode(sys.stdin.buffer.read(), type=FrontendSpec))


# ------------------------------------------------------------------------------------ the supervisor


class _Frontend:
    """One frontend process and the pipe it says "serving" on."""

    def __init__(self, spec: FrontendSpec, index: int) -> None:
        self.index = index
        read, write = os.pipe()
        spec = msgspec.structs.replace(spec, ready_fd=write)
        # a session of its own: a Ctrl-C reaches the supervisor alone, which stops the frontends first
        self.process = subprocess.Popen([sys.executable, "-m", "groupwise.inference.frontends"], stdin=subprocess.PIPE,
                                        pass_fds=(write,), start_new_session=True)
        os.close(write)
        self._ready = read
        assert self.process.stdin is not None
        self.process.stdin.write(msgspec.msgpack.encode(spec))
        self.process.stdin.close()

    def wait_ready(self, engine: Any) -> None:
        """Until it serves; a frontend that exits first, or a core that dies meanwhile, fails the server."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        try:
            while True:
                if select.select([self._ready], [], [], LIVENESS_S)[0] and os.read(self._ready, 1):
                    return
                if self.process.poll() is not None:
                    raise FrontendsFailed(f"frontend {self.index} (pid {self.process.pid}) exited before it served, "
                                          f"{_exit_text(self.process.returncode)}; its log above says why")
                if engine.failure is not None:
                    raise FrontendsFailed(str(engine.failure))
                if time.monotonic() > deadline:
                    raise FrontendsFailed(f"frontend {self.index} (pid {self.process.pid}) did not serve within "
                                          f"{READY_TIMEOUT_S:g} s")
        finally:
            os.close(self._ready)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self) -> None:
        try:
            self.process.wait(timeout=GRACE_S + 5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"exit code {code} (killed by {signal.Signals(-code).name})"
        except ValueError:
            return f"exit code {code}"
    return f"exit code {code}"


def serve_frontends(engine: Any, spec: FrontendSpec, count: int) -> None:
    """Serve through `count` frontend processes of the core `engine` (this process's client of it: it owns
    the core) until SIGINT/SIGTERM; replace a frontend that dies; raise `FrontendsFailed` when the core dies
    or a frontend cannot start (module doc). The caller closes `engine`."""
    with bind_port(spec.host, spec.port, shared=False) as alone:  # free, even of another server's shared group
        port = alone.getsockname()[1]
    held = bind_port(spec.host, port)  # kept while serving: no other user's process can take the port
    spec = msgspec.structs.replace(spec, port=port, supervisor_pid=os.getpid())
    frontends: list[_Frontend] = []
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops as Ctrl-C does
    try:
        frontends = [_Frontend(spec, i) for i in range(count)]
        budgets = [RestartBudget() for _ in range(count)]
        for frontend in frontends:
            frontend.wait_ready(engine)
        print(f"serving through {count} frontend processes (pids {', '.join(str(f.process.pid) for f in frontends)}) "
              f"on http://{spec.host}:{spec.port}/v1", flush=True)
        while True:
            time.sleep(LIVENESS_S)
            if engine.failure is not None:
                raise FrontendsFailed(f"{engine.failure} Every frontend answered 503 meanwhile; the server stopped.")
            for i, frontend in enumerate(frontends):
                if frontend.process.poll() is not None:
                    if not budgets[i].spend():
                        raise FrontendsFailed(
                            f"frontend {i} died {budgets[i].limit + 1} times within {budgets[i].window_s:g} s (the last, "
                            f"pid {frontend.process.pid}, {_exit_text(frontend.process.returncode)}); the server "
                            "stopped rather than restart it again: its log above says why")
                    print(f"frontend {i} (pid {frontend.process.pid}) exited, {_exit_text(frontend.process.returncode)}; "
                          "its requests were freed in the core; starting another", file=sys.stderr, flush=True)
                    frontends[i] = _Frontend(spec, i)
                    frontends[i].wait_ready(engine)
                    print(f"frontend {i}: pid {frontends[i].process.pid} serving", flush=True)
    except KeyboardInterrupt:  # asked to stop: not a failure (exit 0, as uvicorn's)
        print("stopping the frontends and the engine core", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for frontend in frontends:
            frontend.stop()
        for frontend in frontends:
            frontend.wait()
        held.close()


if __name__ == "__main__":
    main()
