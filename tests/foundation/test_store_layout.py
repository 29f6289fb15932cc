"""The run store's layout is ART's: ``<path>/<project>/models/<name>/`` holding ``history.jsonl``,
``trajectories/<split>/<step:04d>.jsonl``, ``state.json`` and ``checkpoints/<step:04d>/``, so paths a
program builds as ART builds them (by hand, or with ``art.utils.output_dirs``) find the files; a run of
groupwise's earlier layout (``<path>/<project>/<name>/``) is moved into place once, losslessly."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import groupwise as gw
import groupwise.runs.store as store_module
from groupwise.errors import GroupwiseWarning
from groupwise.runs.store import RunStore, project_run_dirs, run_dir_of
from groupwise.utils import output_dirs
from groupwise.utils.get_model_step import get_model_step, get_step_from_dir


def _group(reward: float, text: str = "hi") -> gw.TrajectoryGroup:
    return gw.TrajectoryGroup([gw.Trajectory(messages_and_choices=[{"role": "user", "content": text},
                                                                    {"role": "assistant", "content": text * 2}],
                                             reward=reward, metadata={"k": text})])


def _legacy_run(base: Path, project: str, name: str) -> Path:
    """A run written as groupwise wrote runs before ART's layout: the same files, one level higher."""
    legacy = base / project / name
    s = RunStore(base / ".making", project, name)
    s.write_trajectories("train", 3, [_group(1.0), _group(0.0, "yo")])
    s.write_trajectories("val", 2, [_group(0.5)])
    s.append_history({"step": 2, "split": "val", "reward": 0.5})
    s.append_history({"step": 3, "split": "train", "reward": 0.5, "loss": 0.25})
    s.write_state({"cursor": 7})
    (s.checkpoints_dir / "0004").mkdir(parents=True)
    (s.checkpoints_dir / "0004" / "adapter_config.json").write_text('{"r": 8}')
    legacy.parent.mkdir(parents=True, exist_ok=True)
    os.rename(s.run_dir, legacy)
    shutil.rmtree(base / ".making")
    return legacy


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_paths_built_as_art_builds_them_find_the_files(tmp_path):
    s = RunStore(tmp_path, "proj", "run-1")
    s.write_trajectories("train", 5, [_group(1.0)])
    s.append_history({"step": 5, "split": "train", "reward": 1.0})
    s.write_state({"a": 1})
    # ART's layout, spelt out: <art_path>/<project>/models/<name>/...
    model_dir = f"{tmp_path}/proj/models/run-1"
    assert str(s.run_dir) == model_dir
    assert Path(f"{model_dir}/trajectories/train/0005.jsonl").is_file()
    assert Path(f"{model_dir}/history.jsonl").is_file() and Path(f"{model_dir}/state.json").is_file()
    assert str(s.checkpoints_dir) == f"{model_dir}/checkpoints"
    # ART's helpers, as programs call them, return the same places
    assert output_dirs.get_models_dir("proj", str(tmp_path)) == f"{tmp_path}/proj/models"
    assert output_dirs.get_output_dir_from_model_properties("proj", "run-1", str(tmp_path)) == model_dir
    assert output_dirs.get_step_checkpoint_dir(model_dir, 5) == f"{model_dir}/checkpoints/0005"
    assert output_dirs.get_trajectories_dir(model_dir) == f"{model_dir}/trajectories"
    assert output_dirs.get_trajectories_split_dir(model_dir, "val") == f"{model_dir}/trajectories/val"
    model = gw.TrainableModel(name="run-1", project="proj", base_model="x", base_path=str(tmp_path))
    assert output_dirs.get_model_dir(model) == model_dir == output_dirs.get_model_dir(model, str(tmp_path))
    assert model._get_output_dir() == model_dir  # ART 0.5's own name for it
    # a program's own path helper, as ART's pipeline example writes it, reads the history
    assert (Path(model.base_path) / model.project / "models" / model.name / "history.jsonl").is_file()
    Path(output_dirs.get_step_checkpoint_dir(model_dir, 2)).mkdir(parents=True)
    assert get_step_from_dir(model_dir) == 2 == get_model_step(model, str(tmp_path))


def test_an_earlier_layout_run_moves_into_place_once_losslessly(tmp_path):
    legacy = _legacy_run(tmp_path, "p", "agent")
    before = _tree(legacy)
    groups_before = gw.load_trajectories(legacy)
    s = RunStore(tmp_path, "p", "agent")
    assert s.run_dir == tmp_path / "p" / "models" / "agent" and not legacy.exists()
    assert _tree(s.run_dir) == before  # every byte, every file
    assert s.load_trajectories() == groups_before
    assert [r["step"] for r in s.history()] == [2, 3] and s.read_state() == {"cursor": 7}
    # the run goes on where it was: appends land in the moved history, replacing by key as before
    s.append_history({"step": 3, "split": "train", "reward": 0.75})
    assert [(r["step"], r["reward"]) for r in s.history()] == [(2, 0.5), (3, 0.75)]
    # opened again: nothing left to move, the same folder
    assert RunStore(tmp_path, "p", "agent").run_dir == s.run_dir


def test_readers_of_a_project_see_both_layouts(tmp_path):
    _legacy_run(tmp_path, "p", "old")
    RunStore(tmp_path, "p", "new").write_trajectories("train", 0, [_group(1.0)])
    runs = project_run_dirs(tmp_path, "p")
    assert runs == [tmp_path / "p" / "models" / "new", tmp_path / "p" / "models" / "old"]
    from groupwise.utils.benchmarking.load_trajectories import trajectory_rows

    assert sorted({r["model"] for r in trajectory_rows("p", art_path=str(tmp_path))}) == ["new", "old"]
    assert [p.relative_to(tmp_path).as_posix() for p in store_module.find_runs(tmp_path)] == \
        ["p/models/new", "p/models/old"]


def test_an_earlier_run_named_models_moves_beside_the_new_runs(tmp_path):
    legacy = _legacy_run(tmp_path, "p", "models")
    before = _tree(legacy)
    other = RunStore(tmp_path, "p", "other")  # a run of the new layout, inside the old run's folder
    other.write_trajectories("train", 0, [_group(1.0)])
    assert other.run_dir == tmp_path / "p" / "models" / "other"
    s = RunStore(tmp_path, "p", "models")
    assert s.run_dir == tmp_path / "p" / "models" / "models"
    assert _tree(s.run_dir) == before
    assert sorted(p.name for p in (tmp_path / "p" / "models").iterdir()) == ["models", "other"]
    assert len(other.load_trajectories()) == 1


def test_a_run_another_process_writes_is_read_where_it_is(tmp_path):
    legacy = _legacy_run(tmp_path, "p", "busy")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"), str(legacy / ".writer.lock")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.warns(GroupwiseWarning, match="another process is writing it"):
            s = RunStore(tmp_path, "p", "busy")
        assert s.run_dir == legacy and len(s.load_trajectories()) == 3
    finally:
        holder.kill()
        holder.wait()
    assert RunStore(tmp_path, "p", "busy").run_dir == tmp_path / "p" / "models" / "busy"  # moved once free


def test_a_store_that_cannot_be_moved_is_read_where_it_is(tmp_path, monkeypatch):
    legacy = _legacy_run(tmp_path, "p", "ro")

    def refuse(*args):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(store_module.os, "rename", refuse)
    with pytest.warns(GroupwiseWarning, match="could not be moved.*Read-only file system"):
        s = RunStore(tmp_path, "p", "ro")
    assert s.run_dir == legacy and [r["step"] for r in s.history()] == [2, 3]


def test_a_stale_earlier_folder_beside_the_moved_run_is_named(tmp_path):
    RunStore(tmp_path, "p", "twice").write_state({"new": True})
    stale = tmp_path / "p" / "twice"
    stale.mkdir()
    (stale / "history.jsonl").write_text("")
    with pytest.warns(GroupwiseWarning, match="is not read: the run's folder is"):
        s = RunStore(tmp_path, "p", "twice")
    assert s.read_state() == {"new": True}


def test_a_folder_that_is_no_run_is_left_alone(tmp_path):
    (tmp_path / "p" / "notes").mkdir(parents=True)
    (tmp_path / "p" / "notes" / "readme.txt").write_text("x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = RunStore(tmp_path, "p", "notes")
    assert s.run_dir == tmp_path / "p" / "models" / "notes" and (tmp_path / "p" / "notes" / "readme.txt").is_file()
    assert run_dir_of(tmp_path, "p", "absent") == tmp_path / "p" / "models" / "absent"
