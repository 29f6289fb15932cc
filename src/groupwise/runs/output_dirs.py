"""ART's path helpers (`art.utils.output_dirs`), returning ART's layout, which is the run store's: a
run's folder is ``<path>/<project>/models/<name>`` (`groupwise.runs.store.RunStore`), its checkpoints
``checkpoints/<step:04d>`` (peft's adapter_model.safetensors and adapter_config.json, as ART's) and its
trajectories ``trajectories/<split>/<step:04d>.jsonl`` under it, its metrics ``history.jsonl`` beside
them. Code that builds these paths by hand, as ART's programs do, finds the same files.

`art_path` is the backend's folder (`LocalBackend(path=...)`); by default groupwise's, ``.groupwise`` in
the working directory (ART's is ``.art`` at the root of the git repository: `art_path_or_default` reads
``./.art`` as groupwise's default when no such folder exists)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from groupwise.config import DEFAULT_RUN_STORE
from groupwise.runs.store import CHECKPOINTS_DIR, MODELS_DIR, TRAJECTORIES_DIR, run_dir_of, step_dir_name

__all__ = ["ART_DEFAULT_PATH", "art_path_or_default", "get_default_art_path", "get_model_dir", "get_models_dir", "get_output_dir_from_model_properties",
           "get_step_checkpoint_dir", "get_trajectories_dir", "get_trajectories_split_dir"]


# ART's own default folder, the default of its readers' `art_path`/`api_path` arguments
ART_DEFAULT_PATH = "./.art"


def get_default_art_path() -> str:
    return os.path.abspath(DEFAULT_RUN_STORE)


def art_path_or_default(art_path: str | None) -> str:
    """The store folder an ART reader means: `art_path`, except where it is None or ART's own default
    (``./.art``) and no such folder exists: then groupwise's default store, where this machine's runs are."""
    if art_path is None or (os.path.normpath(art_path) == os.path.normpath(ART_DEFAULT_PATH)
                            and not os.path.isdir(art_path)):
        return get_default_art_path()
    return os.path.abspath(art_path)


def get_models_dir(project_name: str, art_path: str | None = None) -> str:
    """The folder holding a project's runs, ``<art_path>/<project>/models``."""
    return os.path.join(art_path or get_default_art_path(), project_name, MODELS_DIR)


def get_output_dir_from_model_properties(project: str, name: str, art_path: str | None = None) -> str:
    """A run's folder, ``<art_path>/<project>/models/<name>`` (a run of groupwise's earlier layout is
    moved there first: `groupwise.runs.store.run_dir_of`)."""
    return str(run_dir_of(art_path or get_default_art_path(), project, name))


def get_model_dir(model: Any, art_path: str | None = None) -> str:
    """`model`'s run folder: the one its store writes (its run name, its backend's folder), or the
    same run's folder under `art_path`."""
    if art_path is None:
        return os.path.abspath(model.store.run_dir)
    return get_output_dir_from_model_properties(model.project, model.storage_name, art_path)


def get_step_checkpoint_dir(model_output_dir: str, step: int) -> str:
    return str(Path(model_output_dir) / CHECKPOINTS_DIR / step_dir_name(step))


def get_trajectories_dir(model_output_dir: str) -> str:
    return str(Path(model_output_dir) / TRAJECTORIES_DIR)


def get_trajectories_split_dir(model_output_dir: str, split: str) -> str:
    return str(Path(model_output_dir) / TRAJECTORIES_DIR / split)
