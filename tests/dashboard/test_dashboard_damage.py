"""A step summary (derived data beside each step file) damaged in any way -- cut short, emptied, binary
bytes, another JSON shape, fields of other types, values edited by hand -- is not used: every dashboard
view answers 200 with exactly what an undamaged copy of the run shows (read from the step file, the
record), and the background indexer lives on and indexes the next step."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from dash_helpers import write_step  # noqa: E402
from groupwise.dashboard.app import create_app  # noqa: E402
from groupwise.runs.step_summary import read_summary, summary_path  # noqa: E402
from groupwise.runs.store import RunStore  # noqa: E402

RUN = "2048/models/agent"
DAMAGED = [("train", 1), ("val", 2), ("train", 3)]  # the summaries each case damages


def _edit(change):
    def damage(raw: bytes) -> bytes:
        body = json.loads(raw)
        change(body)
        return json.dumps(body).encode()
    return damage


def _set(path: list, value):
    def change(body):
        at = body
        for k in path[:-1]:
            at = at[k]
        at[path[-1]] = value
    return _edit(change)


DAMAGES = {
    "cut short": lambda raw: raw[: len(raw) // 2],
    "cut to one byte": lambda raw: raw[:1],
    "emptied": lambda raw: b"",
    "binary garbage": lambda raw: bytes(range(256)) * 4,
    "not UTF-8": lambda raw: b"\xff\xfe" + raw,
    "a list": lambda raw: b"[]",
    "null": lambda raw: b"null",
    "a number": lambda raw: b"1e999",
    "nested 100000 deep": lambda raw: b"[" * 100000,
    "groups as text": _set(["groups"], "x"),
    "a group as a number": _set(["groups", 0], 5),
    "a reward as text": _set(["trajectories", 0, "reward"], "high"),
    "a reward as a huge integer": _set(["trajectories", 0, "reward"], 10**400),
    "metrics as a list": _set(["trajectories", 0, "metrics"], [1]),
    "a metric as text": _set(["trajectories", 0, "metrics", "correct"], "yes"),
    "a trajectory of group 99": _set(["trajectories", 0, "group"], 99),
    "a group index as text": _set(["trajectories", 0, "group"], "0"),
    "a text as null": _set(["trajectories", 0, "text"], None),
    "a negative count": _set(["groups", 0, "n"], -1),
    "exceptions as numbers": _set(["groups", 0, "exceptions"], [1, 2]),
    "a scenario as a list": _set(["groups", 0, "scenario"], [1]),
    "metadata as text": _set(["groups", 0, "metadata"], "x"),
    "a trajectory dropped": _edit(lambda b: b["trajectories"].pop()),
    "trajectories swapped": _edit(lambda b: b["trajectories"].reverse()),
    "a reward edited by hand": _set(["trajectories", 0, "reward"], 0.99),
    "an answer edited by hand": _set(["trajectories", 2, "answer"], "forged"),
    "a prompt edited by hand": _set(["groups", 1, "prompt"], "forged"),
    "its digest removed": _edit(lambda b: b.pop("body_blake2b")),
    "another version": _set(["version"], 99),
    "'of' removed": _edit(lambda b: b.pop("of")),
}


def _views(client: TestClient) -> dict[str, object]:
    """Every view's answer that depends on the trajectories (the run list's clock-dependent fields aside)."""
    out: dict[str, object] = {}
    calls = [("/api/steps", {}), ("/api/curves", {}), ("/api/judge", {}),
             ("/api/rollouts", {"limit": 1000}), ("/api/rollouts", {"split": "val", "order": "worst"}),
             ("/api/rollouts", {"q": "final answer 3", "reward_min": 0.2}), ("/api/rollouts", {"q": "forged"}),
             ("/api/rollouts", {"step_min": 1, "step_max": 1, "reward_max": 0.3}),
             ("/api/compare", {"split": "train", "a": "1", "b": "3"}), ("/api/compare", {"a": "0", "b": "latest"})]
    calls += [("/api/groups", {"split": split, "step": step}) for split, step in DAMAGED + [("train", 0)]]
    calls += [("/api/trajectory", {"split": "train", "step": 1, "group": g, "index": i}) for g in range(3) for i in (0, 3)]
    for path, params in calls:
        r = client.get(path, params={"run": RUN, **params})
        assert r.status_code == 200, (path, params, r.status_code, r.text[:300])
        out[f"{path} {sorted(params.items())}"] = r.json()
    runs = client.get("/api/runs").json()["runs"]
    out["runs"] = [{k: r[k] for k in ("id", "latest_step", "train_steps", "best_step", "metric", "alerts", "rows")}
                   for r in runs]
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> tuple[Path, dict[str, object]]:
    root = tmp_path_factory.mktemp("pristine")
    store = RunStore(root, "2048", "agent")
    for step in range(4):
        write_step(store, step)
    return root, _views(TestClient(create_app(root)))


def _damaged_copy(pristine_root: Path, target: Path, damage) -> Path:
    shutil.copytree(pristine_root / "2048", target / "2048")
    for split, step in DAMAGED:
        path = summary_path(target / "2048" / "models" / "agent" / "trajectories" / split / f"{step:04d}.jsonl")
        path.write_bytes(damage(path.read_bytes()))
    return target


@pytest.mark.parametrize("how", sorted(DAMAGES))
def test_every_view_shows_the_step_files_data_whatever_the_damage(pristine, tmp_path, how):
    root, expected = pristine
    damaged = _damaged_copy(root, tmp_path, DAMAGES[how])
    for split, step in DAMAGED:  # the damaged summary is not used...
        assert read_summary(damaged / "2048" / "models" / "agent" / "trajectories" / split / f"{step:04d}.jsonl") is None, how
    assert _views(TestClient(create_app(damaged))) == expected  # ... and nothing shown differs


def test_a_summary_made_a_folder_is_read_around(pristine, tmp_path):
    root, expected = pristine
    damaged = _damaged_copy(root, tmp_path, lambda raw: raw)
    path = summary_path(damaged / "2048" / "models" / "agent" / "trajectories" / "train" / "0001.jsonl")
    path.unlink()
    path.mkdir()
    assert _views(TestClient(create_app(damaged))) == expected


def test_the_indexer_lives_on_after_damaged_summaries_and_indexes_the_next_step(pristine, tmp_path):
    root, _ = pristine
    damaged = _damaged_copy(root, tmp_path, DAMAGES["a reward as text"])
    store = RunStore(damaged, "2048", "agent")
    q = {"run": RUN}
    with TestClient(create_app(damaged)) as client:  # `with`: the lifespan, which runs the indexer thread
        def indexed(files: int) -> dict:
            deadline = time.monotonic() + 60
            while True:
                progress = client.get("/api/indexed", params=q).json()
                if progress == {"files": files, "indexed": files} or time.monotonic() > deadline:
                    return progress
                time.sleep(0.05)

        assert indexed(6) == {"files": 6, "indexed": 6}
        # more damage while it runs: a summary of binary bytes, one cut short
        for split, step, damage in (("train", 0, DAMAGES["binary garbage"]), ("val", 0, DAMAGES["cut short"])):
            path = summary_path(store.run_dir / "trajectories" / split / f"{step:04d}.jsonl")
            path.write_bytes(damage(path.read_bytes()))
        write_step(store, 4)
        assert indexed(8) == {"files": 8, "indexed": 8}
        rows = client.get("/api/rollouts", params={**q, "step_min": 4, "split": "train"}).json()
        assert rows["total"] == 12


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                           max_leaves=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_summary_with_any_one_value_replaced_is_used_unchanged_or_not_at_all(pristine, data, tmp_path_factory):
    """read_summary gives the summary as written, or None: never a damaged one (any value of any field,
    at any depth, replaced by any JSON value; or a byte flipped anywhere)."""
    root, _ = pristine
    step_file = root / "2048" / "models" / "agent" / "trajectories" / "train" / "0002.jsonl"
    raw = summary_path(step_file).read_bytes()
    written = read_summary(step_file)
    assert written is not None
    body = json.loads(raw)
    at, keys = body, []
    while isinstance(at, (dict, list)) and at and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(at)) if isinstance(at, dict) else st.integers(0, len(at) - 1))
        keys.append(key)
        at = at[key]
    copy = tmp_path_factory.mktemp("mutated") / "0002.jsonl"
    shutil.copy2(step_file, copy)
    if keys:
        parent = body
        for k in keys[:-1]:
            parent = parent[k]
        parent[keys[-1]] = data.draw(json_values)
        mutated = json.dumps(body).encode()
    else:  # a byte flipped
        i = data.draw(st.integers(0, len(raw) - 1))
        mutated = raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1:]
    summary_path(copy).write_bytes(mutated)
    got = read_summary(copy)
    assert got is None or got == written, keys


def test_a_step_file_that_cannot_be_read_is_named_and_the_other_steps_answer(pristine, tmp_path):
    """A folder where a step file should be, and a link to nowhere: that step's views are a 422 naming the
    file, every view across steps answers 200 with the other steps, and the indexer goes on."""
    root, expected = pristine
    damaged = _damaged_copy(root, tmp_path, lambda raw: raw)
    train = damaged / "2048" / "models" / "agent" / "trajectories" / "train"
    (train / "0007.jsonl").mkdir()
    (train / "0008.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    with TestClient(create_app(damaged)) as client:
        for step in (7, 8):
            r = client.get("/api/groups", params={"run": RUN, "split": "train", "step": step})
            assert r.status_code == 422 and f"{step:04d}.jsonl" in r.json()["detail"], r.text
            r = client.get("/api/trajectory", params={"run": RUN, "split": "train", "step": step, "group": 0, "index": 0})
            assert r.status_code == 422, r.text
        got = client.get("/api/rollouts", params={"run": RUN, "limit": 1000})
        assert got.status_code == 200 and got.json() == expected[f"/api/rollouts {sorted({'limit': 1000}.items())}"]
        assert client.get("/api/judge", params={"run": RUN}).json() == expected["/api/judge []"]
        store = RunStore(damaged, "2048", "agent")
        write_step(store, 4)
        deadline = time.monotonic() + 60
        while client.get("/api/indexed", params={"run": RUN}).json()["indexed"] < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.get("/api/indexed", params={"run": RUN}).json() == {"files": 10, "indexed": 8}
