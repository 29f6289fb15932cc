"""The module paths groupwise had before its folders became the layer map, and ART's paths, kept importable.

ART programs import ART's modules by path (``from art.utils.output_dirs import get_model_dir``,
``import art.dev``), and ported programs do the same under ``groupwise``. Those modules now live in
packages that say which layer they belong to (``groupwise.art`` for ART's paths, ``groupwise.core``,
``groupwise.runs``, ``groupwise.runtime``), and groupwise's own earlier paths (``groupwise.store``,
``groupwise.types``) are still in users' code. This finder, first on ``sys.meta_path``, answers an old
path with the module at its new path: one module object under both names, so a class compares equal and
a monkeypatch reaches the code that runs. It answers nothing else.

The table is the whole move; code inside the package imports the new paths (tests/layers_check.py).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

# old path -> new path, both without ``groupwise.``; a package's entry covers its submodules.
ALIASES: dict[str, str] = {
    'adapter_names': 'core.adapter_names',
    'art.utils.output_dirs': 'runs.output_dirs',
    'art.utils.s3': 'runs.s3',
    'art_internals': 'art.internals',
    'attention_backends': 'runtime.attention_backends',
    'auto_trajectory': 'art.auto_trajectory',
    'batches': 'art.batches',
    'captures': 'core.captures',
    'choices': 'core.choices',
    'compat': 'core.compat',
    'compute': 'runtime.compute',
    'curves': 'runs.curves',
    'dev': 'art.dev',
    'gather': 'art.gather',
    'guided_completion': 'art.guided_completion',
    'history': 'runs.history',
    'hooks': 'art.hooks',
    'http_guard': 'core.http_guard',
    'inspect': 'runs.transcript',
    'judge.cost': 'core.cost',
    'learning_signal': 'core.learning_signal',
    'loading': 'runtime.loading',
    'local': 'art.local',
    'loop.compare': 'runs.compare',
    'loop.report': 'runs.report',
    'loop.series': 'runs.series',
    'memory': 'runtime.memory',
    'metrics': 'core.metrics',
    'module_walk': 'runtime.module_walk',
    'openai': 'core.chat_stream',
    'pipeline_trainer': 'art.pipeline_trainer',
    'protocols': 'chat.protocols',
    'readers': 'core.readers',
    'recording': 'core.recording',
    'rewards': 'art.rewards',
    'run_id': 'runs.run_id',
    'run_lock': 'runs.lock',
    'serverless': 'art.serverless',
    'skypilot': 'art.skypilot',
    'special_tokens': 'runtime.special_tokens',
    'step_summary': 'runs.step_summary',
    'store': 'runs.store',
    'training.advantages': 'core.advantages',
    'trajectories': 'art.trajectories',
    'types': 'core.trajectory',
    'utils': 'art.utils',
    'utils.iterate_dataset': 'core.iterate_dataset',
    'utils.output_dirs': 'runs.output_dirs',
    'utils.retry': 'core.retry',
    'utils.s3': 'runs.s3',
    'utils.split_dataset': 'core.split_dataset',
    'validated': 'core.validated',
    'wandb_log': 'runs.wandb_log',
    'yield_trajectory': 'art.yield_trajectory',
}


def new_path(fullname: str) -> str | None:
    """The new full name of an old ``groupwise.`` path (``groupwise.utils.retry`` ->
    ``groupwise.core.retry``, ``groupwise.dev.engine`` -> ``groupwise.art.dev.engine``), else None."""
    if not fullname.startswith("groupwise."):
        return None
    rest = fullname[len("groupwise."):]
    parts = rest.split(".")
    for end in range(len(parts), 0, -1):
        old = ".".join(parts[:end])
        if old in ALIASES:
            return "groupwise." + ".".join([ALIASES[old], *parts[end:]])
    return None


class _AliasLoader(importlib.abc.Loader):
    """Gives the import system the module at the new path instead of loading a second copy."""

    def __init__(self, fullname: str, target: str) -> None:
        self.fullname = fullname
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        # The import system set the alias's spec on the module; it keeps its own (reload, pickle, -m).
        own = _OWN_SPECS.get(self.target)
        if own is not None:
            module.__spec__ = own
        # A package whose __init__ binds a function named like a submodule that moved elsewhere
        # (``groupwise.utils.retry``): its old path is registered now, as it was when ``utils/__init__``
        # imported it, so a later ``import groupwise.utils.retry`` finds it loaded and leaves the
        # package's ``retry`` the function (the import system rebinds the attribute only on a first load).
        # The same for every submodule the package loaded itself (``utils/__init__`` imports
        # ``get_model_step``, the module, and binds ``get_model_step``, the function): registered under
        # the old path now, a later ``from groupwise.utils.get_model_step import ...`` finds it loaded.
        for name, loaded in list(sys.modules.items()):
            if name.startswith(self.target + "."):
                sys.modules.setdefault(self.fullname + name[len(self.target):], loaded)
        prefix = next((k for k, v in ALIASES.items() if "groupwise." + v == self.target), None)
        if prefix is not None:
            for key, value in ALIASES.items():
                if key.startswith(prefix + ".") and ("groupwise." + value) in sys.modules:
                    sys.modules.setdefault("groupwise." + key, sys.modules["groupwise." + value])


_OWN_SPECS: dict[str, importlib.machinery.ModuleSpec] = {}


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        new = new_path(fullname)
        if new is None:
            return None
        try:
            module = importlib.import_module(new)
        except ModuleNotFoundError as error:
            if error.name != new:
                raise  # the module exists and something it imports is missing
            return None  # no such module at the new path either: other finders answer (art.internals)
        if module.__spec__ is not None and module.__spec__.name == new:
            _OWN_SPECS[new] = module.__spec__
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(fullname, new), is_package=hasattr(module, "__path__"))


_FINDER = _AliasFinder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once): before the path finder, which would otherwise
    load a second copy of a moved package's submodule under its old name."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
