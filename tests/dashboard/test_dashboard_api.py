"""The dashboard's JSON API on recorded run folders: one written by the real loop (`gw.fit` with the
scripted backend of the loop tests), one written step by step through the run store (dash_helpers)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from dash_helpers import reward_of, write_step, write_stop  # noqa: E402
from groupwise.dashboard.app import create_app  # noqa: E402
from groupwise.runs.lock import RunLock  # noqa: E402
from groupwise.runs.store import RunStore  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loop"))
from loop_helpers import run_scripted  # noqa: E402


@pytest.fixture(scope="module")
def looped(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("looped")
    asyncio.run(run_scripted(str(base)))
    return base


@pytest.fixture
def written(tmp_path) -> tuple[Path, RunStore]:
    store = RunStore(tmp_path, "2048", "agent")
    for step in range(4):
        write_step(store, step)
    return tmp_path, store


def test_a_run_of_the_real_loop_lists_its_state_best_step_and_validation(looped):
    client = TestClient(create_app(looped))
    runs = client.get("/api/runs").json()["runs"]
    assert [r["id"] for r in runs] == ["loop/models/scripted"]
    r = runs[0]
    assert (r["state"], r["rule"]) == ("stopped", "max_steps")
    assert "reached max_steps=6" in r["detail"]
    assert (r["latest_step"], r["train_steps"], r["best_step"], r["metric"]) == (5, 6, 6, "accuracy")
    assert r["base"]["value"] == pytest.approx(0.2) and r["best"]["value"] == pytest.approx(0.8)
    assert r["minutes"] > 0 and r["steps_per_min"] == pytest.approx(6 / r["minutes"])
    # the same run opened at its own folder is the one run there
    assert [x["id"] for x in TestClient(create_app(looped / "loop" / "models" / "scripted")).get("/api/runs").json()["runs"]] == ["."]


def test_curves_of_the_real_loop(looped):
    cv = TestClient(create_app(looped)).get("/api/curves", params={"run": "loop/models/scripted"}).json()
    assert cv["train"]["step"] == [0, 1, 2, 3, 4, 5]
    assert cv["train"]["reward"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    assert cv["val"]["step"] == [0, 2, 4, 6] and cv["val"]["value"] == pytest.approx([0.2, 0.4, 0.6, 0.8])
    assert [b["name"] for b in cv["baselines"]] == ["scripted@0"] and cv["baselines"][0]["value"] == pytest.approx(0.2)
    assert cv["stop"]["rule"] == "max_steps" and cv["stop"]["best_step"] == 6
    assert cv["metrics"]["loss"] == [0.5] * 6
    assert len(cv["phases"]["train_s"]) == len(cv["phases"]["step"]) == 7  # steps 0..5 trained, 6 validated


def test_curves_carry_bands_trainer_metrics_judge_agreement_and_alerts_linked_to_evidence(written):
    root, _ = written
    cv = TestClient(create_app(root)).get("/api/curves", params={"run": "2048/models/agent"}).json()
    t = cv["train"]
    assert t["step"] == [0, 1, 2, 3]
    for m, lo, hi, sd in zip(t["reward"], t["lo"], t["hi"], t["std"]):
        assert sd > 0 and lo == pytest.approx(m - sd) and hi == pytest.approx(m + sd)
    assert cv["metric"] == "correct" and cv["val"]["step"] == [0, 2]
    assert all(lo <= v <= hi for v, lo, hi in zip(cv["val"]["value"], cv["val"]["lo"], cv["val"]["hi"]))
    assert cv["metrics"]["kl"] == pytest.approx([0.0, 0.001, 0.002, 0.003])
    assert cv["metrics"]["grad_norm"] == pytest.approx([1.0, 1.1, 1.2, 1.3])
    # the judge's score orders every pair the way ground truth (correct) does in these groups
    judge = TestClient(create_app(root)).get("/api/judge", params={"run": "2048/models/agent"}).json()
    assert judge == {"step": [0, 2], "value": [1.0, 1.0]}
    (alert,) = cv["alerts"]
    assert (alert["name"], alert["step"], alert["severity"]) == ("identical_answers", 2, "warning")
    assert alert["link"] == {"split": "train", "step": 2, "group": 1}


def test_groups_rank_by_reward_and_a_trajectory_shows_the_conversation_and_what_the_loss_saw(written):
    root, _ = written
    client = TestClient(create_app(root))
    assert client.get("/api/steps", params={"run": "2048/models/agent"}).json() == {"train": [0, 1, 2, 3], "val": [0, 2]}
    view = client.get("/api/groups", params={"run": "2048/models/agent", "split": "train", "step": 3}).json()
    assert [g["scenario"] for g in view["groups"]] == [0, 1, 2]
    g1 = view["groups"][1]
    assert [t["reward"] for t in g1["trajectories"]] == [reward_of(3, 1, i) for i in (3, 2, 1, 0)]
    assert sum(t["advantage"] for t in g1["trajectories"]) == pytest.approx(0.0, abs=1e-9)
    d = client.get("/api/trajectory", params={"run": "2048/models/agent", "split": "train", "step": 3, "group": 1, "index": 2}).json()
    assert d["reward"] == reward_of(3, 1, 2) and d["advantage"] > 0
    assert [m["role"] for m in d["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    sampled = d["messages"][2]
    assert sampled["sampled"] and sampled["tool_calls"][0]["name"] == "make_move"
    assert [t["loss"] for t in sampled["tokens"]] == ["forced", "trained", "trained", "trained", "trained", "forced"]
    assert sampled["tokens"][0]["text"] == "{ " and sampled["tokens"][0]["logprob"] == pytest.approx(-0.25)
    assert d["messages"][3]["tool_call_id"] == "call_3_1_2" and "tokens" not in d["messages"][3]
    assert d["logs"] == ["judge: trajectory 2 scored 0.36 because it merged tiles"]
    missing = client.get("/api/trajectory", params={"run": "2048/models/agent", "split": "train", "step": 3, "group": 9, "index": 0})
    assert missing.status_code == 404


def test_rollout_filters_and_two_steps_side_by_side(written):
    root, _ = written
    client = TestClient(create_app(root))
    q = {"run": "2048/models/agent", "split": "train"}
    best = client.get("/api/rollouts", params={**q, "limit": 3}).json()
    assert best["total"] == 4 * 3 * 4 and [r["reward"] for r in best["rollouts"]] == [reward_of(3, 2, 3), reward_of(3, 1, 3), reward_of(3, 0, 3)]
    worst = client.get("/api/rollouts", params={**q, "order": "worst", "step_min": 1, "step_max": 1}).json()
    assert worst["total"] == 12 and worst["rollouts"][0]["reward"] == reward_of(1, 0, 0)
    ranged = client.get("/api/rollouts", params={**q, "reward_min": 0.3, "reward_max": 0.35}).json()
    assert ranged["total"] > 0 and all(0.3 <= r["reward"] <= 0.35 for r in ranged["rollouts"])
    found = client.get("/api/rollouts", params={**q, "q": "final answer 3 for scenario 2"}).json()
    assert found["total"] == 4 and {(r["group"], r["index"]) for r in found["rollouts"]} == {(2, 3)}
    cmp = client.get("/api/compare", params={"run": "2048/models/agent", "split": "val", "a": "0", "b": "latest"}).json()
    assert (cmp["a"], cmp["b"]) == (0, 2) and [s["scenario"] for s in cmp["scenarios"]] == [0, 1, 2]
    assert [t["reward"] for t in cmp["scenarios"][1]["b"]] == [reward_of(2, 1, i) for i in (3, 2, 1, 0)]
    assert client.get("/api/compare", params={"run": "2048/models/agent", "a": "x"}).status_code == 400


def test_the_step_index_agrees_with_the_validated_trajectory_view(written):
    # every view but one trajectory's reads the step summaries (unvalidated, written by the store); what
    # they show of a trajectory must be what its own view, read through the validated types, shows
    root, store = written
    client = TestClient(create_app(root))
    for split, step in (("train", 1), ("val", 2)):
        view = client.get("/api/groups", params={"run": "2048/models/agent", "split": split, "step": step}).json()
        listed = client.get("/api/rollouts", params={"run": "2048/models/agent", "split": split, "step_min": step,
                                                     "step_max": step, "limit": 1000}).json()["rollouts"]
        key = lambda r: (r["group"], r["index"])  # noqa: E731
        assert sorted(listed, key=key) == sorted((t for g in view["groups"] for t in g["trajectories"]), key=key)
        assert len(listed) == 12
        for g in view["groups"]:
            for row in g["trajectories"]:
                full = client.get("/api/trajectory", params={"run": "2048/models/agent", **{k: row[k] for k in ("split", "step", "group", "index")}}).json()
                assert (row["reward"], row["advantage"], row["metrics"]) == (full["reward"], full["advantage"], full["metrics"])
                last = [m for m in full["messages"] if m["role"] == "assistant"][-1]
                assert row["answer"] == " ".join(f"{last['content']} {' '.join(c['name'] + '(' + c['arguments'] + ')' for c in last['tool_calls'])}".split())
                assert g["prompt"] == [m for m in full["messages"] if m["role"] == "user"][-1]["content"]
                assert (g["scenario"], g["logs"]) == (full["scenario"], full["group_logs"])
    cmp = client.get("/api/compare", params={"run": "2048/models/agent", "split": "val", "a": "0", "b": "2"}).json()
    view = client.get("/api/groups", params={"run": "2048/models/agent", "split": "val", "step": 2}).json()
    assert [s["prompt"] for s in cmp["scenarios"]] == [g["prompt"].replace("step 2", "step 0") for g in view["groups"]]
    assert [s["b"] for s in cmp["scenarios"]] == [g["trajectories"] for g in view["groups"]]
    # the sampled turn (a Choice as stored) and the judge's explanation in the logs are searchable
    q = {"run": "2048/models/agent", "split": "train", "step_min": 2, "step_max": 2}
    assert client.get("/api/rollouts", params={**q, "q": "make_move"}).json()["total"] == 12
    assert client.get("/api/rollouts", params={**q, "q": "trajectory 3 scored"}).json()["total"] == 3


def test_a_trajectory_opens_from_its_own_group_and_a_broken_group_is_named(written):
    root, store = written
    path = store.run_dir / "trajectories" / "train" / "0001.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[1] = lines[1].replace('"reward":', '"reward":"high","was":', 1)  # group 1 no longer validates
    path.write_text("".join(lines), encoding="utf-8")
    client = TestClient(create_app(root))
    q = {"run": "2048/models/agent", "split": "train", "step": 1}
    assert [g["group"] for g in client.get("/api/groups", params=q).json()["groups"]] == [0, 1, 2]
    assert client.get("/api/trajectory", params={**q, "group": 2, "index": 3}).json()["reward"] == reward_of(1, 2, 3)
    broken = client.get("/api/trajectory", params={**q, "group": 1, "index": 0})
    assert broken.status_code == 422 and "group 1 of" in broken.json()["detail"] and "reward" in broken.json()["detail"]
    assert client.get("/api/trajectory", params={**q, "group": 3, "index": 0}).status_code == 404
    assert client.get("/api/trajectory", params={**q, "step": 9, "group": 0, "index": 0}).status_code == 404


def test_a_step_rewritten_on_disk_is_read_again(written):
    # a resumed run redoes the step it crashed in and rewrites its file: the views show the new groups
    root, store = written
    client = TestClient(create_app(root))
    q = {"run": "2048/models/agent", "split": "train"}
    assert len(client.get("/api/groups", params={**q, "step": 3}).json()["groups"]) == 3
    assert client.get("/api/rollouts", params={**q, "step_min": 3}).json()["total"] == 12
    write_step(store, 3, n_groups=2, per_group=2)
    assert len(client.get("/api/groups", params={**q, "step": 3}).json()["groups"]) == 2
    assert client.get("/api/rollouts", params={**q, "step_min": 3}).json()["total"] == 4


def test_views_across_steps_read_the_step_summaries_and_not_the_step_files(written, monkeypatch):
    # a text search, a reward or step range, compare and the judge's agreement over a run written with
    # summaries parse no step file (the step files' token logprobs are what made a cold search slow)
    root, _ = written
    from groupwise.dashboard import rollouts

    def refuse(*a, **k):
        raise AssertionError("a step file was parsed although its summary describes it")

    monkeypatch.setattr(rollouts, "read_group_dicts", refuse)
    client = TestClient(create_app(root))
    q = {"run": "2048/models/agent", "split": "train"}
    assert client.get("/api/rollouts", params={**q, "q": "trajectory 3 scored"}).json()["total"] == 12
    expected = sum(reward_of(s, g, i) >= 0.3 for s in range(3) for g in range(3) for i in range(4))
    assert client.get("/api/rollouts", params={**q, "reward_min": 0.3, "step_max": 2}).json()["total"] == expected == 12
    assert client.get("/api/judge", params={"run": "2048/models/agent"}).json() == {"step": [0, 2], "value": [1.0, 1.0]}
    assert len(client.get("/api/compare", params={"run": "2048/models/agent", "a": "0", "b": "2"}).json()["scenarios"]) == 3


def test_a_run_written_before_step_summaries_shows_the_same_as_one_with_them(written, tmp_path):
    root, store = written
    old = tmp_path / "older"
    shutil.copytree(root / "2048", old / "2048")
    for f in (old / "2048").rglob("*.summary.json"):
        f.unlink()  # as code that wrote no summaries left it
    # and a step rewritten by such code after its summary was written: the stale summary is not read
    (store.run_dir / "trajectories" / "train" / "0003.jsonl").write_text(
        (old / "2048" / "models" / "agent" / "trajectories" / "train" / "0001.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    shutil.copyfile(store.run_dir / "trajectories" / "train" / "0003.jsonl", old / "2048" / "models" / "agent" / "trajectories" / "train" / "0003.jsonl")
    new_c, old_c = TestClient(create_app(root)), TestClient(create_app(old))
    for path, params in (("/api/rollouts", {"split": "train", "limit": 1000}), ("/api/rollouts", {"split": "val", "order": "worst"}),
                         ("/api/rollouts", {"q": "final answer 3", "reward_min": 0.2}), ("/api/judge", {}),
                         ("/api/compare", {"split": "train", "a": "1", "b": "3"})):
        params = {"run": "2048/models/agent", **params}
        got = new_c.get(path, params=params).json()
        assert got == old_c.get(path, params=params).json(), (path, params)
        assert got != {} and got.get("total", 1) > 0
    # step 3 now holds step 1's groups: its rows say so (reward and the answer read from the file)
    rows = new_c.get("/api/rollouts", params={"run": "2048/models/agent", "split": "train", "step_min": 3, "limit": 1000}).json()
    assert sorted(r["reward"] for r in rows["rollouts"]) == sorted(reward_of(1, g, i) for g in range(3) for i in range(4))


def test_while_the_app_runs_every_trajectory_file_gets_indexed_and_so_does_a_new_step(written):
    root, store = written
    q = {"run": "2048/models/agent"}
    with TestClient(create_app(root)) as client:  # `with`: the app's lifespan, which runs the indexer
        def indexed() -> dict:
            deadline = time.monotonic() + 30
            while True:
                progress = client.get("/api/indexed", params=q).json()
                if progress["indexed"] == progress["files"] or time.monotonic() > deadline:
                    return progress
                time.sleep(0.05)

        assert indexed() == {"files": 6, "indexed": 6}  # train 0-3, val 0 and 2
        write_step(store, 4)
        assert indexed() == {"files": 8, "indexed": 8}
    assert TestClient(create_app(root)).get("/api/indexed", params=q).json() == {"files": 8, "indexed": 0}


def test_state_follows_the_writer_lock_and_a_run_that_ended_without_a_stop_is_crashed(written):
    root, store = written
    client = TestClient(create_app(root))
    lock = RunLock(store.run_dir).acquire()
    try:
        r = client.get("/api/runs").json()["runs"][0]
        assert r["state"] == "training" and f"pid {os.getpid()}" in r["detail"]
    finally:
        lock.release()
    old = time.time() - 3600
    os.utime(store.history_path, (old, old))
    assert client.get("/api/runs").json()["runs"][0]["state"] == "crashed"
    write_stop(store, 4, best_step=2)
    r = client.get("/api/runs").json()["runs"][0]
    assert (r["state"], r["best_step"]) == ("stopped", 2)


def test_unknown_runs_paths_outside_the_folder_and_a_missing_key_are_refused(written, tmp_path):
    root, _ = written
    client = TestClient(create_app(root))
    assert client.get("/api/curves", params={"run": "../.."}).status_code == 404
    assert client.get("/api/curves", params={"run": "2048/nope"}).status_code == 404
    keyed = TestClient(create_app(root, api_key="s3cret"))
    assert keyed.get("/api/runs").status_code == 401
    assert keyed.get("/api/runs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert keyed.get("/").status_code == 200  # the page itself holds no run data


def test_the_command_refuses_a_public_address_without_a_key_and_a_file_for_a_folder(tmp_path, capsys):
    from groupwise.cli import main

    assert main(["dashboard", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "--api-key KEY is required" in capsys.readouterr().err
    (tmp_path / "history.jsonl").write_text("")
    assert main(["dashboard", str(tmp_path / "history.jsonl")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_a_port_in_use_is_refused_before_the_address_is_printed(tmp_path, capsys):
    from groupwise.dashboard.app import serve_dashboard
    from groupwise.errors import ConfigError

    with socket.socket() as taken:  # another dashboard left running holds the port
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot serve on 127.0.0.1:{port}.*--port {port + 1}"):
            serve_dashboard(str(tmp_path), host="127.0.0.1", port=port, api_key=None)
    assert capsys.readouterr().out == ""


def test_before_the_first_run_the_folder_lists_nothing_then_the_run_as_soon_as_it_takes_its_lock(tmp_path):
    client = TestClient(create_app(tmp_path / ".groupwise"))  # `groupwise dashboard` before `groupwise train`
    assert client.get("/api/runs").json()["runs"] == []
    store = RunStore(tmp_path / ".groupwise", "2048", "2048-s0")
    lock = store.lock().acquire()  # `groupwise train` takes the lock, then loads the model for a minute
    try:
        [r] = client.get("/api/runs").json()["runs"]
        assert (r["id"], r["state"], r["latest_step"]) == ("2048/models/2048-s0", "training", None)
        assert "nothing written yet" in r["detail"]
        assert client.get("/api/curves", params={"run": r["id"]}).json()["train"]["step"] == []
        assert client.get("/api/steps", params={"run": r["id"]}).json() == {}
    finally:
        lock.release()
    # the job ends (a crash while validating the base, say) before its first row: the folder says so
    [r] = client.get("/api/runs").json()["runs"]
    assert (r["state"], r["detail"]) == ("empty", "the job that took this folder ended before writing a step (its output says why)")
    lock = store.lock().acquire()
    try:
        write_step(store, 0)
        [r] = client.get("/api/runs").json()["runs"]
        assert (r["state"], r["latest_step"]) == ("training", 0) and "nothing written" not in r["detail"]
    finally:
        lock.release()


def test_the_dashboard_loads_no_torch_and_ships_its_chart_library():
    code = ("import sys, groupwise.cli, groupwise.dashboard.app as a; "
            "assert 'torch' not in sys.modules, 'torch loaded'; "
            "print(sorted(p.name for p in a.STATIC.iterdir()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ}, check=True).stdout
    for name in ("index.html", "app.js", "style.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"):
        assert name in out


def test_a_choice_with_logprobs_as_lists_shows_its_tokens_texts():
    """Choices sampled by groupwise's own client carry logprobs and texts as plain lists
    (groupwise.core.choices.TOKEN_DATA_HEADER): the token view shows them as it does per-token entries."""
    from openai.types.chat.chat_completion import Choice

    from groupwise.dashboard.rollouts import tokens

    c = Choice.model_validate({"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi there"},
                               "logprobs": None, "token_ids": [5, 6, 2], "token_logprobs": [-0.5, -1.0, -0.1],
                               "token_texts": ["hi", " there", "<|im_end|>"], "forced_token_indices": [2]})
    assert tokens(c, 0.5) == [{"id": 5, "text": "hi", "logprob": -0.5, "loss": "trained"},
                              {"id": 6, "text": " there", "logprob": -1.0, "loss": "trained"},
                              {"id": 2, "text": "<|im_end|>", "logprob": -0.1, "loss": "forced"}]
