"""W&B as ART's `Model` feeds it (groupwise.runs.wandb_log), checked in W&B's offline mode: the run files W&B
writes are read back (`wandb_records`) and must hold the run ART would make (project, name, id, entity,
config) and one history record per logged row, named as ART names its metrics."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import pytest

import groupwise as gw
from groupwise.runs import wandb_log
from groupwise.errors import ConfigError, GroupwiseWarning

wandb = pytest.importorskip("wandb", reason="the W&B test needs the wandb package (the dev extra has it)")


def wandb_records(wandb_dir: Path, run_id: str = "*") -> list:
    """The records of the one offline run (of that id) under `wandb_dir`: W&B's ``run-<id>.wandb`` file is a LevelDB
    log (32 KiB blocks of records with a 7-byte header, after a 7-byte ":W&B" file header) of protobuf
    `Record`s."""
    from wandb.proto import wandb_internal_pb2 as pb

    wandb.teardown()  # waits for W&B's service to write out what it was sent
    (path,) = wandb_dir.glob(f"wandb/offline-run-*/run-{run_id}.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks, partial = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            chunks.append(chunk)
        elif kind == 2:
            partial = chunk
        elif kind == 3:
            partial += chunk
        elif kind == 4:
            chunks.append(partial + chunk)
    records = []
    for chunk in chunks:
        record = pb.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def history(records) -> list[dict]:
    return [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # W&B reads its settings (WANDB_DIR) once per process setup: start a fresh one
    yield tmp_path
    wandb.teardown()


def _group(rewards, **metrics):
    return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=r,
                                             metrics=dict(metrics)) for r in rewards])


async def test_each_logged_step_is_a_wandb_history_record_named_as_arts(offline, tmp_path):
    model = gw.Model(name="agent-7", project="wb-proj", entity="my-team", base_path=str(tmp_path / "runs"))
    model.update_wandb_config({"lr": 1e-5, "env": {"size": 4}})  # before the run exists: given to wandb.init
    await model.log([_group([0.0, 1.0], turns=3)], split="train", step=0)
    model.update_wandb_config({"env": {"seed": 1}})  # a live run: its config is updated
    await model.log([_group([1.0, 1.0], turns=2)], split="train", step=1)
    await model.log([_group([0.5, 0.5])], split="val", step=1)
    await model.log(metrics={"loss/train": 0.25, "custom": 2.0}, split="train", step=1)
    await model.close()

    records = wandb_records(offline)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.display_name, run.run_id, run.entity) == ("wb-proj", "agent-7", "agent-7", "my-team")
    config = {i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") in ("run", "config")
              for i in (r.run.config.update if r.WhichOneof("record_type") == "run" else r.config.update)}
    assert config["lr"] == 1e-5 and config["env"] == {"size": 4, "seed": 1}
    rows = history(records)
    assert [r["training_step"] for r in rows] == [0, 1, 1, 1]
    assert rows[0]["train/reward"] == 0.5 and rows[0]["train/turns"] == 3 and rows[0]["train/n_trajectories"] == 2
    assert rows[1]["train/reward"] == 1.0 and rows[2]["val/reward"] == 0.5 and "train/reward" not in rows[2]
    # a name in one of ART's sections keeps it; a bare one gets the split; the row's merged reward stays
    assert rows[3]["loss/train"] == 0.25 and rows[3]["train/custom"] == 2.0
    assert all("time/wall_clock_sec" in r for r in rows)
    # the run's own history is written as before
    assert [(r["split"], r["step"]) for r in gw.load_history(model.run_dir)] == [("train", 0), ("train", 1), ("val", 1)]


async def test_a_trainable_model_has_update_wandb_config_and_its_train_rows_reach_wandb(offline, tmp_path,
                                                                                       tiny_model_dir):
    """ART's course calls update_wandb_config right after building the model; the backend's train rows
    (written by the backend, not by model.log) are logged too."""
    model = gw.TrainableModel(name="course", project="wb", base_model=tiny_model_dir)
    model.update_wandb_config({"course": "lesson-1"})
    backend = gw.LocalBackend(path=str(tmp_path / "runs"), best_checkpoint_metric=None)
    await model.register(backend)
    try:
        client = model.openai_client()
        trajectories = []
        for i in range(4):
            messages = [{"role": "user", "content": "hi"}]
            r = await client.chat.completions.create(model=model.inference_name(), messages=messages, max_tokens=3,
                                                     seed=i)
            trajectories.append(gw.Trajectory(messages_and_choices=[*messages, r.choices[0]], reward=float(i)))
        await model.train([gw.TrajectoryGroup(trajectories)], config=gw.TrainConfig(learning_rate=1e-4))
    finally:
        await backend.close()
    # the backend's close finished the model's W&B run: the user's next wandb.init() (a notebook's next
    # cell) is the global run again, so wandb.log and define_metric work (an open run made them fail)
    user = wandb.init(project="next-cell", id="next-cell")
    assert wandb.run is user
    wandb.define_metric("*", step_metric="x")
    wandb.finish()
    await model.close()
    records = wandb_records(offline, run_id="course")
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == "course" and json.loads(
        {i.key: i.value_json for i in run.config.update}["course"]) == "lesson-1"
    rows = history(records)
    assert any(r["training_step"] == 0 and r["train/reward"] == 1.5 and "train/loss" in r for r in rows), rows


def test_wandb_config_is_immutable_once_set_as_arts(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    model = gw.Model(name="m", project="p", base_path=str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.update_wandb_config({"a": {"b": 1}})
        model.update_wandb_config({"a": {"c": 2}, "d": 3})
    assert model.wandb_config_so_far() == {"a": {"b": 1, "c": 2}, "d": 3}
    # not configured: said once, naming where the metrics are
    said = [str(w.message) for w in caught if issubclass(w.category, GroupwiseWarning)]
    assert len(said) == 1 and "history.jsonl" in said[0] and "WANDB_API_KEY" in said[0]
    with pytest.raises(ConfigError, match="immutable.*'a.b'"):
        model.update_wandb_config({"a": {"b": 2}})
    with pytest.raises(gw.errors.ArgumentTypeError):
        model.update_wandb_config([("a", 1)])


async def test_without_the_wandb_package_a_run_asking_for_wandb_trains_and_says_once_where_its_metrics_are(
        tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb" or name.startswith("wandb."):
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    model = gw.Model(name="m", project="p", base_path=str(tmp_path), report_metrics=["wandb"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(3):
            await model.log([_group([1.0])], split="val", step=step)
    said = [str(w.message) for w in caught if issubclass(w.category, GroupwiseWarning)]
    assert len(said) == 1 and "pip install wandb" in said[0] and str(model.run_dir / "history.jsonl") in said[0]
    assert len(gw.load_history(model.run_dir)) == 3


def test_when_metrics_go_to_wandb_is_arts_rule(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert not wandb_log.wandb_wanted(None)
    assert wandb_log.wandb_wanted(["wandb"]) and not wandb_log.wandb_wanted([])
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert wandb_log.wandb_wanted(None) and not wandb_log.wandb_wanted(["tensorboard"])
    monkeypatch.delenv("WANDB_API_KEY")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_log.wandb_wanted(None)
    assert wandb_log.art_metric_names({"step": 3, "split": "val", "recorded_at": "t", "reward": 1.0, "ok": True,
                                       "time/step_s": 2.0, "train/x": 1, "n": float("nan"), "note": "a"}) == {
        "val/reward": 1.0, "time/step_s": 2.0, "train/x": 1}


async def test_report_metrics_wandb_without_a_key_starts_no_run_and_says_where_the_metrics_are(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    model = gw.Model(name="m", project="p", base_path=str(tmp_path), report_metrics=["wandb"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await model.log([_group([1.0])], split="val", step=0)
        await model.log([_group([1.0])], split="val", step=1)
    said = [str(w.message) for w in caught if issubclass(w.category, GroupwiseWarning)]
    assert len(said) == 1 and "WANDB_API_KEY" in said[0] and "history.jsonl" in said[0]
    assert not (tmp_path / "wandb").exists()
