"""`groupwise dashboard` answers only requests that name it: a web page that points its own name at
127.0.0.1 (DNS rebinding) or a page of another site reads nothing, on every route; `--allowed-host`
lets a name through. Driven over real HTTP against the command itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from dash_helpers import write_step  # noqa: E402
from http_forgery import forged_hosts, forged_origins, free_port, probe, probe_allowed, wait_until_up  # noqa: E402
from groupwise.runs.store import RunStore  # noqa: E402

RUN = "2048/models/agent"
ROUTES = [("GET", "/", None), ("GET", "/static/app.js", None), ("GET", "/api/runs", None),
          ("GET", f"/api/curves?run={RUN}", None), ("GET", f"/api/steps?run={RUN}", None),
          ("GET", f"/api/indexed?run={RUN}", None), ("GET", f"/api/judge?run={RUN}", None),
          ("GET", f"/api/groups?run={RUN}&split=train&step=1", None), ("GET", f"/api/rollouts?run={RUN}&q=board", None),
          ("GET", f"/api/trajectory?run={RUN}&split=train&step=1&group=0&index=0", None),
          ("GET", f"/api/compare?run={RUN}&split=val&a=0&b=2", None), ("POST", "/api/runs", {"x": 1}),
          ("DELETE", f"/api/curves?run={RUN}", None), ("GET", "/api/unknown", None)]


def test_forged_host_and_origin_are_refused_on_every_route_and_an_allowed_name_passes(tmp_path):
    import httpx

    store = RunStore(tmp_path, "2048", "agent")
    for step in range(3):
        write_step(store, step)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "groupwise", "dashboard", str(tmp_path), "--port", str(port),
                             "--allowed-host", "my-box.lan"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    try:
        wait_until_up(port, proc)
        # the README's line still works as printed: the page and its data at http://127.0.0.1:PORT/
        page = httpx.get(f"http://127.0.0.1:{port}/")
        assert page.status_code == 200 and "<html" in page.text.lower()
        runs = httpx.get(f"http://127.0.0.1:{port}/api/runs").json()["runs"]
        assert [r["id"] for r in runs] == [RUN]
        tally = probe(port, ROUTES, extra_forged_hosts=["my-box.lan.evil.example"])
        tally.check()
        allowed = probe_allowed(port, ROUTES, "my-box.lan")
        allowed.check()
        # what the data routes answer through an allowed name is the data itself
        via_name = httpx.get(f"http://127.0.0.1:{port}/api/steps", params={"run": RUN}, headers={"Host": "my-box.lan"})
        assert via_name.json() == {"train": [0, 1, 2], "val": [0, 2]}
        print(f"dashboard: {tally.refused + allowed.refused} forged requests refused, "
              f"{tally.answered + allowed.answered} honest ones answered")
        per_route = 2 * (len(forged_hosts(port)) + 1) + len(forged_origins(port))
        assert (tally.refused, allowed.refused) == (len(ROUTES) * per_route, len(ROUTES) * 4)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_allowed_host_that_is_no_name_is_refused_on_the_command_line(tmp_path):
    from groupwise.cli import main

    for bad in ("http://my-box.lan", "my box", "a/b", ""):
        with pytest.raises(SystemExit) as exc:
            main(["dashboard", str(tmp_path), "--allowed-host", bad])
        assert exc.value.code == 2, bad
