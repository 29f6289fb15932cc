"""`groupwise dashboard [PATH]`: the web app (FastAPI) that serves the page and its JSON API.

The page (static/index.html, app.js) polls the API every 2 s, so a step the loop writes appears within
seconds. The charts are uPlot's (static/uPlot.*, MIT, its LICENSE beside it), shipped inside the
package: the dashboard works offline and fetches nothing from any other host.

Like `groupwise serve`, it binds to loopback by default; any other address needs ``--api-key``, which
the API then requires as ``Authorization: Bearer <key>`` (the page takes it from ``#key=...`` in its
address and sends it). The static files carry no run data and are served without the key.
"""

from __future__ import annotations

import hmac
import socket
import threading
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from groupwise.dashboard import rollouts as ro
from groupwise.dashboard import runs as rs
from groupwise.errors import ConfigError, GroupwiseError, StoreError
from groupwise.core.http_guard import HostGuard
from groupwise.runs.view import find_runs

STATIC = Path(str(resources.files("groupwise.dashboard") / "static"))


def _json(obj: Any) -> Response:
    return Response(rs.json_bytes(obj), media_type="application/json", headers={"Cache-Control": "no-store"})


def create_app(root: str | Path, *, api_key: str | None = None, allowed_hosts: Iterable[str] = (),
               bound_host: str | None = None) -> FastAPI:
    """The dashboard over every run at or under `root`. While the app runs (its lifespan), a background
    thread indexes the trajectory files (`rollouts.index_in_background`). Every request must name the
    server in ``Host`` (localhost, `bound_host`, the address it arrived at, or one of `allowed_hosts`)
    and a browser's ``Origin`` must be the page itself, else 403 (groupwise.core.http_guard): a page on
    another site could otherwise read every run by pointing its own name at this machine."""
    root = Path(root).resolve()
    cache = ro.GroupCache()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = threading.Event()
        indexer = threading.Thread(target=ro.index_in_background, args=(cache, lambda: find_runs(root), stop),
                                   name="groupwise-dashboard-index", daemon=True)
        indexer.start()
        try:
            yield
        finally:
            stop.set()
            indexer.join(timeout=5)

    app = FastAPI(title="groupwise dashboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    @app.middleware("http")
    async def require_key(request: Request, call_next: Any) -> Any:
        if api_key is not None and request.url.path.startswith("/api/"):
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _json_error(401, "invalid or missing API key (open the page as http://HOST:PORT/#key=KEY)")
        return await call_next(request)

    def run_dir(run: str) -> Path:
        try:
            return rs.resolve_run(root, run)
        except GroupwiseError as exc:
            raise ro.ParamError(str(exc), param="run") from None

    @app.exception_handler(ro.ParamError)
    async def param_error(request: Request, exc: ro.ParamError) -> Response:
        return _json_error(exc.status, str(exc), param=exc.param)

    @app.exception_handler(StoreError)
    async def unreadable(request: Request, exc: StoreError) -> Response:
        """Stored data that cannot be read (a step file that is a folder, a group that does not validate):
        422 saying which, while the other views and steps answer."""
        return _json_error(422, str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid_param(request: Request, exc: RequestValidationError) -> Response:
        """A parameter that is missing or not of its type (a step of letters, or of 5,000 digits): 422
        naming it, in the page's one error shape."""
        first = exc.errors()[0] if exc.errors() else {}
        where = [str(x) for x in first.get("loc", ()) if x not in ("query", "path")]
        param = where[-1] if where else None
        given = first.get("input")
        shown = repr(given) if not isinstance(given, str) or len(given) <= 40 else \
            f"{given[:40]!r}... ({len(given)} characters)"
        return _json_error(422, f"parameter {param}: {first.get('msg', 'invalid')} (got {shown})", param=param)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/api/runs")
    def api_runs() -> Response:
        return _json({"root": str(root), "runs": [rs.run_summary(root, d) for d in find_runs(root)]})

    @app.get("/api/curves")
    def api_curves(run: str) -> Response:
        return _json(rs.curves(run_dir(run)))

    @app.get("/api/judge")
    def api_judge(run: str) -> Response:
        # apart from the curves: it reads every validation file once (the cross-step index), which a
        # long run makes the slowest of the first loads
        d = run_dir(run)
        agree = sorted(ro.judge_agreement(cache, d, rs.history_of(d)).items())
        return _json({"step": [s for s, _ in agree], "value": [v for _, v in agree]})

    @app.get("/api/steps")
    def api_steps(run: str) -> Response:
        return _json(ro.steps(run_dir(run)))

    @app.get("/api/indexed")
    def api_indexed(run: str) -> Response:
        return _json(ro.index_progress(cache, run_dir(run)))

    @app.get("/api/groups")
    def api_groups(run: str, split: str, step: int) -> Response:
        return _json(ro.groups_view(cache, run_dir(run), split, step))

    @app.get("/api/rollouts")
    def api_rollouts(run: str, split: str | None = None, step_min: int | None = None, step_max: int | None = None,
                     reward_min: float | None = None, reward_max: float | None = None, q: str | None = None,
                     order: str = ro.ORDER, limit: int = ro.LIMIT) -> Response:
        return _json(ro.rollouts(cache, run_dir(run), split=split or None, step_min=step_min, step_max=step_max,
                                 reward_min=reward_min, reward_max=reward_max, text=q, order=order,
                                 limit=max(1, min(limit, 1000))))

    @app.get("/api/trajectory")
    def api_trajectory(run: str, split: str, step: int, group: int, index: int) -> Response:
        # a group that does not validate is a StoreError: 422 naming it (the page shows the message)
        return _json(ro.trajectory_view(cache, run_dir(run), split, step, group, index))

    @app.get("/api/compare")
    def api_compare(run: str, split: str = "val", a: str = "0", b: str = "latest") -> Response:
        d = run_dir(run)
        return _json(ro.compare_view(cache, d, rs.history_of(d), split, a, b))

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_middleware(HostGuard, allowed=tuple(allowed_hosts), bound=bound_host)  # outermost: before the key
    return app


def _json_error(status: int, message: str, param: str | None = None) -> Response:
    body = {"detail": message, "param": param} if param else {"detail": message}
    return Response(rs.json_bytes(body), status_code=status, media_type="application/json")


def port_problem(host: str, port: int) -> str | None:
    """Why the page cannot be served at host:port, checked before anything is printed: uvicorn would
    print the address as served, then fail to bind and exit, which reads like a dashboard that runs
    (most often a dashboard left running in another terminal holds the port)."""
    if port == 0:
        return None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            return (f"cannot serve on {host}:{port} ({exc.strerror}); another program holds the port (a dashboard "
                    f"still running in another terminal?): stop it, or pass --port {port + 1}")
    return None


def serve_dashboard(path: str, *, host: str, port: int, api_key: str | None,
                    allowed_hosts: Iterable[str] = ()) -> None:
    """Serve the page over the runs under `path` with uvicorn until stopped (the dashboard job checks the
    settings first: off loopback it requires `api_key`)."""
    import uvicorn

    problem = port_problem(host, port)
    if problem:
        raise ConfigError([problem], what="dashboard address")
    app = create_app(path, api_key=api_key, allowed_hosts=allowed_hosts, bound_host=host)
    key = f"#key={api_key}" if api_key else ""
    print(f"groupwise dashboard: {Path(path).resolve()} on http://{host}:{port}/{key}", flush=True)
    if not Path(path).exists():  # started before the first run: the page lists runs as they appear
        print(f"groupwise dashboard: no runs under {path} yet; they appear on the page as they start", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
