"""ART's internal modules (its Unsloth, vLLM, Megatron and Tinker machinery, LocalBackend's internals),
which some public programs import by path (a calendar agent reaching into ART 0.5.17's Unsloth service:
``from art.unsloth.service import do_sleep, ...``, ``from art.vllm import run_on_workers``,
``from art.local.checkpoints import delete_checkpoints``). groupwise has no counterpart: the import
raises `ArtInternalModuleError`, which names the module and what to use instead and is still a
ModuleNotFoundError, so a program's ImportError fallback runs."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

from groupwise.art_internals import INTERNAL_MODULES
from groupwise.errors import ArtInternalModuleError, GroupwiseError

from art_runner import port


@pytest.mark.parametrize("module", sorted(INTERNAL_MODULES))
def test_each_internal_module_says_what_to_use_instead(module):
    """Every listed path is absent here (a listed module that exists would import: a stale row)."""
    with pytest.raises(ArtInternalModuleError) as raised:
        importlib.import_module(f"groupwise.{module}")
    error = raised.value
    assert isinstance(error, ModuleNotFoundError) and isinstance(error, GroupwiseError)
    assert f"`art.{module}`" in str(error) and INTERNAL_MODULES[module] in str(error)
    assert error.name == f"groupwise.{module}"


def test_a_program_importing_art_internals_gets_the_error_and_its_fallback_runs():
    program = port(
        "try:\n"
        "    from art.unsloth.service import do_sleep, do_wake_up\n"
        "    from art.vllm import run_on_workers\n"
        "except ImportError:\n"
        "    do_sleep = do_wake_up = run_on_workers = None\n"
        "import art\n"
        "from art.local import LocalBackend\n"
    )
    namespace: dict = {}
    exec(program, namespace)  # noqa: S102 - the ported program text
    assert namespace["do_sleep"] is None and namespace["LocalBackend"].__name__ == "LocalBackend"
    with pytest.raises(ArtInternalModuleError, match=r"`art\.local\.checkpoints`.*model\.delete_checkpoints"):
        exec(port("from art.local.checkpoints import delete_checkpoints\n"), {})  # noqa: S102


def test_other_missing_modules_stay_plain_import_errors():
    with pytest.raises(ModuleNotFoundError) as raised:
        importlib.import_module("groupwise.no_such_module")
    assert not isinstance(raised.value, GroupwiseError)
    assert importlib.util.find_spec("groupwise.no_such_module") is None
