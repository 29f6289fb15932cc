"""ART's run backups (`art.utils.s3`: `pull_model_from_s3`, `push_model_to_s3`), over a folder.

groupwise does not talk to S3 (no AWS CLI, no boto): the "bucket" is a local folder (a bucket mounted
with mountpoint-s3 or s3fs, a network share, or a folder you sync with ``aws s3 sync``), given as
``s3_bucket=`` or ``$BACKUP_BUCKET`` as ART reads it. A run's copy sits where ART's would:
``<bucket>/[prefix/]<project>/models/<name>``, holding the run folder's files
(`groupwise.runs.output_dirs`). `LocalBackend._experimental_push_to_s3` / `_pull_from_s3` copy the
same way, so a run backed up by either is restored by either.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Literal

from groupwise.errors import ConfigError, GroupwiseError
from groupwise.runs.store import CHECKPOINTS_DIR, TRAJECTORIES_DIR, step_dir_name
from groupwise.runs.output_dirs import get_output_dir_from_model_properties

__all__ = ["ExcludableOption", "mirror", "mirror_dir", "pull_model_from_s3", "push_model_to_s3"]

ExcludableOption = Literal["checkpoints", "logs", "trajectories"]
_EXCLUDED_DIRS = {"checkpoints": CHECKPOINTS_DIR, "trajectories": TRAJECTORIES_DIR, "logs": "logs"}


def mirror_dir(s3_bucket: str | None, prefix: str | None, project: str, name: str) -> Path:
    """The run's copy in the bucket folder: ``<bucket>/[prefix/]<project>/models/<name>``."""
    bucket = s3_bucket or os.environ.get("BACKUP_BUCKET")
    if not bucket:
        raise ConfigError("no bucket: pass s3_bucket= or set BACKUP_BUCKET (as ART reads it)",
                          what="S3 backup arguments")
    if bucket.startswith("s3://"):
        raise GroupwiseError(
            f"{bucket!r}: groupwise does not talk to S3. Its backups copy the run folder to a local "
            "folder: pass s3_bucket='/path/to/folder' (or file:///path), e.g. a bucket mounted with "
            "mountpoint-s3 or s3fs, or sync the run folder yourself with `aws s3 sync`."
        )
    root = Path(bucket.removeprefix("file://"))
    return root.joinpath(*([prefix.strip("/")] if prefix else []), project, "models", name)


def mirror(source: Path, target: Path, delete: bool, exclude: list[str] | tuple[str, ...] = ()) -> None:
    """Copy the tree `source` over `target`, leaving out the top-level folders `exclude`; with
    `delete`, first drop what `source` does not have (the excluded folders of `target` stay). A checkpoints
    folder's dot-folders (a checkpoint being written, replaced, or deleted by retention and not yet
    removed) are not copied: they are no checkpoint, and may vanish while the copy reads them."""
    if delete and target.exists():
        for entry in target.iterdir():
            if entry.name in exclude:
                continue
            if not (source / entry.name).exists():
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
            elif entry.is_dir() and (source / entry.name).is_dir():
                mirror(source / entry.name, entry, delete=True)
    def ignored(folder: str, names: list[str]) -> list[str]:
        out = [n for n in names if Path(folder) == source and n in exclude]
        if Path(folder).name == CHECKPOINTS_DIR:  # a checkpoint being written, replaced or deleted: not the run's
            out += [n for n in names if n.startswith(".")]
        return out

    shutil.copytree(source, target, dirs_exist_ok=True, ignore=ignored)


def _excluded(exclude: list[ExcludableOption] | None) -> list[str]:
    unknown = sorted(set(exclude or ()) - set(_EXCLUDED_DIRS))
    if unknown:
        raise ConfigError([f"exclude={unknown!r}: the options are {sorted(_EXCLUDED_DIRS)}"], what="pull_model_from_s3")
    return [_EXCLUDED_DIRS[e] for e in exclude or ()]


async def pull_model_from_s3(model_name: str, project: str, step: int | None = None, s3_bucket: str | None = None,
                             prefix: str | None = None, verbose: bool = False, delete: bool = False,
                             art_path: str | None = None, exclude: list[ExcludableOption] | None = None) -> str:
    """Copy the run `model_name` of `project` from the bucket folder into its run folder (under
    `art_path`, default groupwise's) and return that folder; `step` copies only that checkpoint.
    A `LocalBackend` registering the model afterwards resumes from the latest checkpoint there."""
    local = Path(get_output_dir_from_model_properties(project, model_name, art_path))
    source = mirror_dir(s3_bucket, prefix, project, model_name)
    excluded = _excluded(exclude)
    if step is not None:
        source = source / CHECKPOINTS_DIR / step_dir_name(step)
        target = local / CHECKPOINTS_DIR / step_dir_name(step)
        excluded = []
    else:
        target = local
    local.mkdir(parents=True, exist_ok=True)
    if source.is_dir():  # as ART's sync of an empty prefix: nothing backed up yet is not an error
        await asyncio.to_thread(mirror, source, target, delete, excluded)
    if verbose:
        print(f"[groupwise] pulled {source} -> {target}" if source.is_dir() else f"[groupwise] nothing at {source}")
    return str(local)


async def push_model_to_s3(model_name: str, project: str, s3_bucket: str | None = None, prefix: str | None = None,
                           verbose: bool = False, delete: bool = False, art_path: str | None = None) -> None:
    """Copy the run folder of `model_name` (under `art_path`, default groupwise's) to the bucket folder;
    `delete` first removes the copy's files the run no longer has."""
    local = Path(get_output_dir_from_model_properties(project, model_name, art_path))
    if not local.is_dir():
        raise GroupwiseError(f"nothing to push: the run folder {local} does not exist (train the model first, "
                             "or pass the art_path= its backend writes under)")
    target = mirror_dir(s3_bucket, prefix, project, model_name)
    await asyncio.to_thread(mirror, local, target, delete)
    if verbose:
        print(f"[groupwise] pushed {local} -> {target}")
