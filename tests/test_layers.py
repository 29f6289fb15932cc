"""The layer rules of src/groupwise, checked on the import graph (the checker: tests/layers_check.py).

The source is parsed with `ast`; nothing is imported or executed. Every rule is also run on a small
synthetic tree with one deliberate break, so a checker that stopped seeing a break fails here too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from layers_check import (
    alias_violations,
    Module,
    PACKAGE,
    SRC,
    client_roots,
    cycles,
    heavy_libraries,
    heavy_violations,
    layer_violations,
    private_member_violations,
    private_violations,
    scan,
    within,
)


# ---------------------------------------------------------------------------------------------- the tree


@pytest.fixture(scope="module")
def tree() -> dict[str, Module]:
    return scan(SRC)


def test_the_scan_sees_the_tree(tree):
    # A scan that found nothing would pass every rule: pin that it sees the layers and their imports.
    for area in ("judge", "inference", "training", "loop", "envs", "backend", "rollout", "jobs", "dashboard"):
        assert any(within(m, f"{PACKAGE}.{area}") for m in tree), area
    fit = tree[f"{PACKAGE}.loop.fit"]
    assert any(imp.target == f"{PACKAGE}.core.trajectory" and imp.at_load for imp in fit.imports)
    assert {"torch", "transformers", "peft", "fastapi"} <= heavy_libraries()
    roots = client_roots(tree)
    assert {f"{PACKAGE}.core.trajectory", f"{PACKAGE}.rollout.gather", f"{PACKAGE}.runs.store", f"{PACKAGE}.judge",
            f"{PACKAGE}.loop", f"{PACKAGE}.model", f"{PACKAGE}.backend.base", f"{PACKAGE}.mcp"} <= roots
    assert all(r in tree for r in roots), sorted(roots - set(tree))


def test_the_cli_is_the_top_floor_over_the_jobs(tree):
    """The house as the imports draw it: the CLI imports every command's job module by name when it loads
    (no importlib strings, so the graph shows them), and no module outside jobs/ but the CLI imports one.
    A command's parts (``jobs/train_sweep.py``: ``<command>_<part>``) are its own: only jobs import them."""
    leaves = {m.rsplit(".", 1)[1] for m in tree if within(m, f"{PACKAGE}.jobs")}
    parts = {f"{PACKAGE}.jobs.{leaf}" for leaf in leaves if "_" in leaf and leaf.split("_", 1)[0] in leaves}
    jobs = {m for m in tree if within(m, f"{PACKAGE}.jobs") and m.rsplit(".", 1)[1] not in ("jobs", "fields", "common")
            and m not in parts}
    assert {f"{PACKAGE}.jobs.{name}" for name in ("train", "sft", "serve", "report", "inspect", "compare",
                                                   "dashboard", "judge_eval")} <= jobs
    cli = tree[f"{PACKAGE}.cli"]
    assert jobs <= {imp.target for imp in cli.imports if imp.at_load}, sorted(jobs)
    importers = {mod.name for mod in tree.values() for imp in mod.imports if within(imp.target, f"{PACKAGE}.jobs")}
    assert {m for m in importers if not within(m, f"{PACKAGE}.jobs")} == {f"{PACKAGE}.cli"}
    part_importers = {mod.name for mod in tree.values() for imp in mod.imports if imp.target in parts}
    assert all(within(m, f"{PACKAGE}.jobs") for m in part_importers), sorted(part_importers)


def test_client_side_loads_no_heavy_library(tree):
    assert heavy_violations(tree, client_roots(tree), heavy_libraries()) == []


def test_layers(tree):
    assert layer_violations(tree) == []


def test_no_private_imports(tree):
    assert private_violations(tree) == []


def test_no_private_members_of_other_modules(tree):
    assert private_member_violations(tree) == []


def test_no_import_cycles(tree):
    assert cycles(tree) == []


# ------------------------------------------------------------------------------ the checker, on deliberate breaks


def write(root: Path, files: dict[str, str]) -> dict[str, Module]:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in sorted({p for rel in files for p in (root / rel).parents if PACKAGE in p.parts}):
        (directory / "__init__.py").touch(exist_ok=True)
    return scan(root)


CLEAN = {
    "groupwise/__init__.py": '_EXPORTS = {"Trajectory": "groupwise.core.trajectory", "fit": "groupwise.loop"}\n'
    '_SUBPACKAGES = ("utils",)\n',
    "groupwise/core/trajectory.py": "import json\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
    "groupwise/art/utils/__init__.py": "",
    "groupwise/cli.py": "import argparse\nfrom groupwise.jobs import train\n",
    "groupwise/runs/transcript.py": "",
    "groupwise/loop/__init__.py": "from groupwise.loop.fit import fit\n",
    "groupwise/loop/x.py": "",
    "groupwise/loop/fit.py": "from groupwise.backend.base import Backend\nfrom groupwise.core.trajectory import json\n"
    "def fit():\n    import groupwise.loop.x\n",
    "groupwise/backend/base.py": "class Backend: ...\n",
    "groupwise/backend/local.py": "from groupwise.backend.base import Backend\n"
    "def engine():\n    import torch\n    from groupwise.inference import engine\n",
    "groupwise/inference/engine.py": "import torch\nclass Engine:\n    def __init__(self):\n"
    "        self._running = []\n        self.state = self\n    def _poll(self):\n        return self._running\n",
    "groupwise/inference/decode.py": "from groupwise.chat.render import json\ndef decode(engine):\n    return engine.state\n",
    "groupwise/training/trainer.py": "import torch\nfrom groupwise.chat import render\n",
    "groupwise/chat/render.py": "import json\n",
    "groupwise/judge/ruler.py": "from groupwise.core.trajectory import json\n",
    "groupwise/envs/_chat.py": "def _helper(): ...\ndef chat(): ...\n",
    "groupwise/envs/math/env.py": "from groupwise.envs._chat import chat\n",
    "groupwise/jobs/train.py": "from groupwise.envs.math import env\nfrom groupwise.jobs import fields\n"
    "def run():\n    from groupwise.backend.local import engine\n",
    "groupwise/jobs/fields.py": "import dataclasses\n",
}


def checks(tree: dict[str, Module]) -> dict[str, list]:
    return {
        "heavy": heavy_violations(tree, client_roots(tree), {"torch", "transformers", "peft"}),
        "layers": layer_violations(tree),
        "private": private_violations(tree),
        "members": private_member_violations(tree),
        "cycles": cycles(tree),
        "aliases": alias_violations(tree),
    }


def test_the_clean_synthetic_tree_passes(tmp_path):
    assert checks(write(tmp_path, CLEAN)) == {"heavy": [], "layers": [], "private": [], "members": [], "cycles": [], "aliases": []}


BREAKS = {
    "the core imports the wing": (
        {"groupwise/core/captures.py": "from groupwise.art.utils import retry\n"},
        "layers", "groupwise.core.captures:1 imports groupwise.art.utils"),
    "a layer imports the wing": (
        {"groupwise/loop/cursor.py": "def f():\n    from groupwise.art.utils import epoch_order\n"},
        "layers", "groupwise.loop.cursor:2 imports groupwise.art.utils"),
    "the core imports the run store": (
        {"groupwise/core/metrics.py": "from groupwise.runs.store import load_history\n", "groupwise/runs/store.py": ""},
        "layers", "groupwise.core.metrics:1 imports groupwise.runs.store"),
    "the run store imports the loop": (
        {"groupwise/runs/store.py": "from groupwise.loop import fit\n"},
        "layers", "groupwise.runs.store:1 imports groupwise.loop"),
    "the torch-side helpers import the engine": (
        {"groupwise/runtime/compute.py": "from groupwise.inference import engine\n"},
        "layers", "groupwise.runtime.compute:1 imports groupwise.inference.engine"),
    "the client side imports a torch-side helper": (
        {"groupwise/judge/ruler.py": "def f():\n    from groupwise.runtime import loading\n", "groupwise/runtime/loading.py": ""},
        "layers", "groupwise.judge.ruler:2 imports groupwise.runtime.loading"),
    "a module imports an old path": (
        {"groupwise/loop/x.py": "from groupwise.store import load_history\n"},
        "aliases", "groupwise.loop.x:1 names groupwise.store: import groupwise.runs.store"),
    "a module imports ART's path of a wing module": (
        {"groupwise/loop/x.py": "import groupwise.utils.output_dirs\n"},
        "aliases", "groupwise.loop.x:1 names groupwise.utils.output_dirs: import groupwise.runs.output_dirs"),
    "a string names an old path": (
        {"groupwise/loop/x.py": "import importlib\nm = importlib.import_module('groupwise.types')\n"},
        "aliases", "groupwise.loop.x:2 names groupwise.types: import groupwise.core.trajectory"),
    "client side imports torch at load": (
        {"groupwise/core/trajectory.py": "import torch.nn\n"}, "heavy", "groupwise.core.trajectory:1 imports torch.nn"),
    "torch reached through a module the client side loads": (
        {"groupwise/loop/fit.py": "from groupwise.backend import local\n"
         "import groupwise.inference.engine\n"}, "heavy", "groupwise.inference.engine:1 imports torch"),
    "judge imports inference": (
        {"groupwise/judge/ruler.py": "def f():\n    from groupwise.inference.engine import Engine\n"},
        "layers", "groupwise.judge.ruler:2 imports groupwise.inference.engine"),
    "judge imports backend under TYPE_CHECKING": (
        {"groupwise/judge/ruler.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
         "    from groupwise.backend.local import LocalBackend\n"},
        "layers", "groupwise.judge.ruler:3 imports groupwise.backend.local"),
    "the judge reads a run's files past the run-reading view": (
        {"groupwise/judge/eval_command.py": "def f():\n    from groupwise.runs.store import load_trajectories\n",
         "groupwise/runs/store.py": ""},
        "layers", "groupwise.judge.eval_command:2 imports groupwise.runs.store"),
    "the dashboard reads a run's history past the run-reading view": (
        {"groupwise/dashboard/runs.py": "from groupwise.runs.store import load_history\n", "groupwise/runs/store.py": ""},
        "layers", "groupwise.dashboard.runs:1 imports groupwise.runs.store"),
    "inspect opens the trajectory files past the run-reading view": (
        {"groupwise/runs/transcript.py": "def f():\n    from groupwise.runs.history import read_jsonl\n",
         "groupwise/runs/history.py": ""},
        "layers", "groupwise.runs.transcript:2 imports groupwise.runs.history"),
    "report reads the writer lock past the run-reading view": (
        {"groupwise/jobs/report.py": "import groupwise.runs.lock\n", "groupwise/runs/lock.py": ""},
        "layers", "groupwise.jobs.report:1 imports groupwise.runs.lock"),
    "training imports inference": (
        {"groupwise/training/trainer.py": "import groupwise.inference.engine as e\n"},
        "layers", "groupwise.training.trainer:1 imports groupwise.inference.engine"),
    "chat imports inference": (
        {"groupwise/chat/render.py": "def f():\n    from groupwise.inference.engine import Engine\n"},
        "layers", "groupwise.chat.render:2 imports groupwise.inference.engine"),
    "chat imports training": (
        {"groupwise/chat/render.py": "from groupwise.training import trainer\n"},
        "layers", "groupwise.chat.render:1 imports groupwise.training.trainer"),
    "inference imports training": (
        {"groupwise/inference/engine.py": "from groupwise.training import trainer\n"},
        "layers", "groupwise.inference.engine:1 imports groupwise.training.trainer"),
    "loop imports a backend other than the contract": (
        {"groupwise/loop/fit.py": "from groupwise.backend.local import engine\n"},
        "layers", "groupwise.loop.fit:1 imports groupwise.backend.local"),
    "loop imports the backend package": (
        {"groupwise/loop/fit.py": "from groupwise.backend import local\n"},
        "layers", "groupwise.loop.fit:1 imports groupwise.backend.local"),
    "the Backend contract imports an implementation": (
        {"groupwise/backend/base.py": "from groupwise.backend.local import engine\n"},
        "layers", "groupwise.backend.base:1 imports groupwise.backend.local"),
    "env imports training": (
        {"groupwise/envs/math/env.py": "from groupwise.training.trainer import torch\n"},
        "layers", "groupwise.envs.math.env:1 imports groupwise.training.trainer"),
    "env imports a job": (
        {"groupwise/envs/math/env.py": "from ...jobs import train\n"},
        "layers", "groupwise.envs.math.env:1 imports groupwise.jobs.train"),
    "library imports a job": (
        {"groupwise/judge/ruler.py": "def f():\n    import groupwise.jobs.train\n"},
        "layers", "groupwise.judge.ruler:2 imports groupwise.jobs.train"),
    "the dashboard imports a job's fields": (
        {"groupwise/dashboard/app.py": "from groupwise.jobs.fields import dataclasses\n"},
        "layers", "groupwise.dashboard.app:1 imports groupwise.jobs.fields"),
    "a module imports the CLI": (
        {"groupwise/loop/x.py": "def f():\n    from groupwise import cli\n"},
        "layers", "groupwise.loop.x:2 imports groupwise.cli"),
    "the CLI dispatches through importlib": (
        {"groupwise/cli.py": "import importlib\ndef main(target):\n    return importlib.import_module(target)\n"},
        "layers", "groupwise.cli:1 imports importlib"),
    "a domain module takes an argparse Namespace": (
        {"groupwise/runs/transcript.py": "import argparse\ndef run(args: argparse.Namespace): ...\n"},
        "layers", "groupwise.runs.transcript:1 imports argparse"),
    "a job imports argparse": (
        {"groupwise/jobs/train.py": "def run():\n    from argparse import Namespace\n"},
        "layers", "groupwise.jobs.train:2 imports argparse"),
    "the dashboard imports the trainer": (
        {"groupwise/core/advantages.py": "def group_advantages(): ...\n",
         "groupwise/dashboard/runs.py": "from groupwise.core.advantages import group_advantages\n"
         "def f():\n    from groupwise.training import trainer\n"},
        "layers", "groupwise.dashboard.runs:3 imports groupwise.training.trainer"),
    "an integration imports the backend": (
        {"groupwise/langgraph/chat_model.py": "def f():\n    from groupwise.backend.local import engine\n"},
        "layers", "groupwise.langgraph.chat_model:2 imports groupwise.backend.local"),
    "groupwise.mcp loads torch": (
        {"groupwise/mcp/__init__.py": "from groupwise.mcp import types\n", "groupwise/mcp/types.py": "import torch\n"},
        "heavy", "groupwise.mcp.types:1 imports torch"),
    "from-import of a private name": (
        {"groupwise/jobs/train.py": "from groupwise.loop.fit import _Loop\n"},
        "private", "groupwise.jobs.train:1 imports private groupwise.loop.fit._Loop"),
    "relative from-import of a private name": (
        {"groupwise/envs/math/env.py": "from .._chat import _helper\n"},
        "private", "groupwise.envs.math.env:1 imports private groupwise.envs._chat._helper"),
    "attribute access to a private name of an imported module": (
        {"groupwise/jobs/train.py": "from groupwise.inference import engine\nx = engine._cache\n"},
        "private", "groupwise.jobs.train:2 reads private groupwise.inference.engine._cache"),
    "attribute access through a dotted import": (
        {"groupwise/jobs/train.py": "import groupwise.inference.engine\n"
         "def f():\n    return groupwise.inference.engine._cache\n"},
        "private", "groupwise.jobs.train:3 reads private groupwise.inference.engine._cache"),
    "private module imported from outside its package": (
        {"groupwise/jobs/train.py": "from groupwise.envs._chat import chat\n"},
        "private", "groupwise.jobs.train:1 imports private module groupwise.envs._chat"),
    "reads a private attribute that another module's class defines": (
        {"groupwise/inference/decode.py": "def decode(engine):\n    return engine._running\n"},
        "members", "groupwise.inference.decode:2 reads ._running of groupwise.inference.engine"),
    "calls a private method of another module's class": (
        {"groupwise/runtime/compute.py": "def main(engines):\n    for e in engines:\n        e._poll()\n"},
        "members", "groupwise.runtime.compute:3 reads ._poll of groupwise.inference.engine"),
    "reads a private attribute through getattr": (
        {"groupwise/loop/fit.py": "def f(backend):\n    return getattr(backend, '_running', None)\n"},
        "members", "groupwise.loop.fit:2 reads ._running of groupwise.inference.engine"),
    "two modules import each other at load": (
        {"groupwise/inference/decode.py": "from groupwise.inference.graphs import run\n",
         "groupwise/inference/graphs.py": "from groupwise.inference import decode\n"},
        "cycles", ["groupwise.inference.decode", "groupwise.inference.graphs"]),
    "a cycle through a package's __init__": (
        {"groupwise/judge/__init__.py": "from groupwise.judge.ruler import x\n",
         "groupwise/judge/ruler.py": "from groupwise.core.trajectory import y\nx = 1\n",
         "groupwise/core/trajectory.py": "from groupwise.judge.cache import z\n",
         "groupwise/judge/cache.py": "z = 1\n"},
        "cycles", ["groupwise.core.trajectory", "groupwise.judge", "groupwise.judge.ruler"]),
}


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_each_deliberate_break_is_reported(tmp_path, case):
    files, rule, expected = BREAKS[case]
    found = checks(write(tmp_path, {**CLEAN, **files}))
    reported = found.pop(rule)
    if isinstance(expected, list):
        assert expected in reported, reported
    else:
        assert any(v.startswith(expected) for v in reported), reported
    # the break is reported by its rule; a rule that fires on everything would not pass the clean tree


def test_how_function_level_and_type_checking_imports_count(tmp_path):
    # CLEAN's backend.local imports torch inside a function: it is no heavy import at load. But a
    # function-level import back into a module that imports you is a cycle, and a TYPE_CHECKING one is not.
    tree = write(tmp_path, {**CLEAN, "groupwise/inference/engine.py": "from groupwise.inference import decode\n",
                            "groupwise/inference/decode.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                            "    from groupwise.inference.engine import Engine\n"})
    assert checks(tree) == {"heavy": [], "layers": [], "private": [], "members": [], "cycles": [], "aliases": []}
    tree = write(tmp_path, {"groupwise/inference/decode.py": "def f():\n    from groupwise.inference import engine\n"})
    assert cycles(tree) == [["groupwise.inference.decode", "groupwise.inference.engine"]]
    # an explicit import of the importer's own package counts (implicit parent initialisation does not)
    tree = write(tmp_path, {"groupwise/loop/fit.py": "from groupwise.loop import Alert\n"})
    assert ["groupwise.loop", "groupwise.loop.fit"] in cycles(tree)
