"""No parameter gives a 500: every route of the dashboard, driven by hypothesis with text holding NUL and
lone surrogates (as a browser sends them: UTF-8 bytes, percent-encoded), huge, negative and 5,000-digit
numbers, unknown runs and splits. Every answer is 200, or a 4xx whose body names the parameter."""

from __future__ import annotations

from urllib.parse import quote

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dash_helpers import write_step  # noqa: E402
from groupwise.dashboard.app import create_app  # noqa: E402
from groupwise.runs.store import RunStore  # noqa: E402

RUN = "2048/models/agent"
EXAMPLES = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])

hostile_text = st.text(st.characters(codec=None, categories=None), max_size=40) | st.sampled_from(
    ["\x00", "a\x00b", "\ud800", "\udfff x", "../..", "/etc/passwd", "..", ".", "", " ", "%00", "\u2028", "２", "²",
     "train\x00", "2048/models/agent/../../..", "2048/models/agent\x00", "\ufeff", "a" * 5000])
numbers = (st.integers() | st.integers(min_value=-10**40, max_value=10**40) | st.sampled_from(
    ["9" * 5000, "-" + "9" * 5000, "1e999", "-1e999", "nan", "inf", "-inf", "1.5", "0x10", "", " 1", "1_000",
     "٣", "+1", "-0", str(2**63), str(-2**63 - 1)])).map(str)


def param(valid: list[str], kind: str) -> st.SearchStrategy[str]:
    return st.sampled_from(valid) | (numbers if kind == "number" else hostile_text | numbers)


def encoded(value: str) -> str:
    """As a browser sends it: the text's UTF-8 bytes (a lone surrogate as its three bytes), percent-encoded."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@pytest.fixture(scope="module")
def app_client(tmp_path_factory):
    root = tmp_path_factory.mktemp("params")
    store = RunStore(root, "2048", "agent")
    for step in range(3):
        write_step(store, step)
    with TestClient(create_app(root), raise_server_exceptions=False) as client:
        yield client


def check(client: TestClient, path: str, params: dict[str, str | None]) -> None:
    query = "&".join(f"{k}={encoded(v)}" for k, v in params.items() if v is not None)
    r = client.get(f"{path}?{query}")
    sent = [k for k, v in params.items() if v is not None]
    assert r.status_code == 200 or (400 <= r.status_code < 500 and r.json().get("param") in sent
                                    and r.json()["param"] in r.json()["detail"]), \
        (path, params, r.status_code, r.text[:300])
    if r.status_code == 200:
        r.json()  # a JSON body the page can read


RUNS = [RUN, "2048/models/agent/", "./2048/models/agent"]
SPLITS = ["train", "val"]
STEPS = ["0", "1", "2"]


@EXAMPLES
@given(route=st.sampled_from(["/api/curves", "/api/judge", "/api/steps", "/api/indexed"]), run=param(RUNS, "text"))
def test_the_run_routes_answer_any_run(app_client, route, run):
    check(app_client, route, {"run": run})


@EXAMPLES
@given(run=param(RUNS, "text"), split=param(SPLITS, "text"), step=param(STEPS, "number"))
def test_the_groups_route_answers_any_parameter(app_client, run, split, step):
    check(app_client, "/api/groups", {"run": run, "split": split, "step": step})


@EXAMPLES
@given(run=param(RUNS, "text"), split=param(SPLITS, "text"), step=param(STEPS, "number"),
       group=param(["0", "1", "2"], "number"), index=param(["0", "3"], "number"))
def test_the_trajectory_route_answers_any_parameter(app_client, run, split, step, group, index):
    check(app_client, "/api/trajectory", {"run": run, "split": split, "step": step, "group": group, "index": index})


@EXAMPLES
@given(run=param(RUNS, "text"), split=st.none() | param(SPLITS, "text"), step_min=st.none() | param(STEPS, "number"),
       step_max=st.none() | param(STEPS, "number"), reward_min=st.none() | param(["0.1", "-1"], "number"),
       reward_max=st.none() | param(["0.3", "1e3"], "number"), q=st.none() | param(["board", "BOARD"], "text"),
       order=st.none() | param(["best", "worst"], "text"), limit=st.none() | param(["1", "50"], "number"))
def test_the_rollouts_route_answers_any_parameter(app_client, run, split, step_min, step_max, reward_min, reward_max,
                                                  q, order, limit):
    check(app_client, "/api/rollouts", {"run": run, "split": split, "step_min": step_min, "step_max": step_max,
                                        "reward_min": reward_min, "reward_max": reward_max, "q": q, "order": order,
                                        "limit": limit})


@EXAMPLES
@given(run=param(RUNS, "text"), split=st.none() | param(SPLITS, "text"),
       a=st.none() | param(["0", "2", "best", "latest"], "text"), b=st.none() | param(["0", "2", "best", "latest"], "text"))
def test_the_compare_route_answers_any_parameter(app_client, run, split, a, b):
    check(app_client, "/api/compare", {"run": run, "split": split, "a": a, "b": b})


@EXAMPLES
@given(path=hostile_text | numbers)
def test_any_path_is_a_page_a_file_or_a_404(app_client, path):
    r = app_client.get("/" + quote(path.encode("utf-8", "surrogatepass"), safe="/"))
    assert r.status_code in (200, 404, 405), (path, r.status_code, r.text[:300])
    r = app_client.get("/static/" + quote(path.encode("utf-8", "surrogatepass"), safe="/"))
    assert r.status_code in (200, 404, 405), (path, r.status_code, r.text[:300])


def test_a_stored_lone_surrogate_is_shown_not_a_500(tmp_path):
    """The store keeps a lone surrogate a rollout wrote (JSON escapes it); UTF-8 cannot carry one, so the
    answer escapes it, and the page's JSON.parse reads back the same text."""
    import json

    from dash_helpers import trajectory
    from groupwise.core.trajectory import TrajectoryGroup

    store = RunStore(tmp_path, "2048", "agent")
    t = trajectory(0, 0, 0)
    t.messages_and_choices.append({"role": "user", "content": "odd \ud800 text \x00 end"})
    store.write_trajectories("train", 0, [TrajectoryGroup([t, trajectory(0, 0, 1)])])
    with TestClient(create_app(tmp_path), raise_server_exceptions=False) as client:
        q = {"run": RUN, "split": "train", "step": 0}
        r = client.get("/api/trajectory", params={**q, "group": 0, "index": 0})
        assert r.status_code == 200 and r.content.isascii()
        assert json.loads(r.content)["messages"][-1]["content"] == "odd \ud800 text \x00 end"
        r = client.get("/api/groups", params=q)
        assert r.status_code == 200 and len(r.json()["groups"][0]["trajectories"]) == 2
        found = client.get("/api/rollouts", params={"run": RUN, "q": "text \x00 end"})
        assert found.status_code == 200 and found.json()["total"] == 1
