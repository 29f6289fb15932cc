"""ART's `get_repo_root_path`: the root of the git repository a program runs in, which ART's examples
build data paths from (``<root>/data/...``)."""

from __future__ import annotations

import os

__all__ = ["get_repo_root_path"]


def get_repo_root_path() -> str:
    """The nearest folder at or above the working directory that holds ``.git``, else ``"."``.

    ART searches from its own installed file, which finds ART's repository in a checkout of ART and
    nothing (``"."``) in a pip install; a program ported to groupwise lives in its own repository, so
    the search starts where the program runs."""
    here = os.path.abspath(os.getcwd())
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return "."
        here = parent
