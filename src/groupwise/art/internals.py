"""ART's internal modules, which programs reach into by path and groupwise has no counterpart of.

ART's public API is at ART's paths here; its machinery is not: the Unsloth and vLLM services inside its
LocalBackend, its Megatron and Tinker backends, its tokenizing and packing of trajectories. A program
that imports one (``from art.unsloth.service import do_sleep``, ``from art.local.checkpoints import
delete_checkpoints``) gets an `ArtInternalModuleError` that names the module, says why it is absent and
what does its job here, instead of a bare ``No module named 'groupwise.unsloth'``. The error is a
ModuleNotFoundError, so a program's ``except ImportError`` fallback still runs.

`install()` (called by ``import groupwise``) puts the finder last on ``sys.meta_path``: it answers only
names under ``groupwise.`` that no real module has and that this table lists.
"""

from __future__ import annotations

import sys
from typing import Any

from groupwise.errors import ArtInternalModuleError

_DRIVE = "drive training with `model.train(...)` / `backend.train(model, ...)` and sampling with `model.openai_client()`"

# ART's module path (without `art.`) -> what it is in ART and what to use here
INTERNAL_MODULES: dict[str, str] = {
    "unsloth": "ART's Unsloth training service inside its LocalBackend; groupwise's LocalBackend trains the "
               f"LoRA adapter itself (`groupwise.training`): {_DRIVE}",
    "vllm": "ART's vLLM server and engine patches; groupwise's LocalBackend serves the model with its own "
            f"engine (OpenAI-compatible, also over HTTP at `model.inference_base_url`): {_DRIVE}",
    "torchtune": "ART's torchtune training service; groupwise's LocalBackend trains the adapter itself: "
                 + _DRIVE,
    "megatron": "ART's MegatronBackend; groupwise trains on several GPUs with `LocalBackend(devices=...)` and "
                "on several hosts with `RayBackend`",
    "tinker": "ART's TinkerBackend (Tinker's hosted training); groupwise trains on this machine: "
              "use `LocalBackend()`",
    "tinker_native": "ART's TinkerNativeBackend (Tinker's hosted training); groupwise trains on this machine: "
                     "use `LocalBackend()`",
    "preprocessing": "ART's tokenizing and packing of trajectory groups for its trainer; groupwise's trainer "
                     f"tokenizes the groups it is given: {_DRIVE}",
    "trajectory_migration": "ART's converter of its older trajectory files; groupwise's run store keeps "
                            "trajectories as JSON lines (`groupwise.runs.store`, `gw.load_history`)",
    "utils.trajectory_migration": "ART's converter of its older trajectory files; groupwise's run store keeps "
                                  "trajectories as JSON lines (`groupwise.runs.store`, `gw.load_history`)",
    "local.service": f"ART LocalBackend's model service (Unsloth and vLLM in a child process): {_DRIVE}",
    "local.state": f"ART LocalBackend's Unsloth model state: {_DRIVE}",
    "local.train": f"ART LocalBackend's training step: {_DRIVE}",
    "local.vllm": f"ART LocalBackend's vLLM server: {_DRIVE}",
    "local.pack": f"ART LocalBackend's packing of tokenized trajectories: {_DRIVE}",
    "local.tokenize": "ART LocalBackend's tokenizing of trajectory groups (`tokenize_trajectory_groups`, "
                      f"`TokenizedResult`); groupwise's trainer tokenizes the groups it is given: {_DRIVE}",
    "skypilot.utils": "ART's helpers for its server on a SkyPilot cluster (task status, the server's and vLLM's "
                      "URLs); groupwise's `SkyPilotBackend` is a `LocalBackend` on this machine, whose server is "
                      "at `model.inference_base_url`",
    "skypilot.stop_server": "ART's script that stops its server on a SkyPilot cluster; groupwise's "
                            "`SkyPilotBackend` runs on this machine: `await backend.close()` stops it",
    "local.checkpoints": "ART LocalBackend's checkpoint folder helpers; here `await model.delete_checkpoints(...)` "
                         "prunes, `groupwise.runs.store.checkpoint_folders` lists a run's checkpoints and "
                         "`groupwise.runs.output_dirs` names their folders",
    "langgraph.logging": "ART's pickled log of LangChain calls behind `wrap_rollout`; groupwise records the "
                         "calls in memory: use `groupwise.langgraph.wrap_rollout` (or "
                         "`groupwise.langgraph.llm_wrapper`'s `add_thread` / `create_messages_from_logs`)",
    "langgraph.message_utils": "ART's conversion of logged LangChain messages behind `wrap_rollout`; use "
                               "`groupwise.langgraph.wrap_rollout`, which fills the trajectory from the calls",
}


def _entry(fullname: str) -> tuple[str, str] | None:
    """The table's entry covering `fullname` (``groupwise.unsloth.service`` -> ``unsloth``), if any."""
    if not fullname.startswith("groupwise."):
        return None
    parts = fullname.split(".")[1:]
    for end in range(len(parts), 0, -1):
        key = ".".join(parts[:end])
        if key in INTERNAL_MODULES:
            return key, INTERNAL_MODULES[key]
    return None


class _ArtInternalsFinder:
    """Last on sys.meta_path: reached only for a module no other finder has."""

    @staticmethod
    def find_spec(fullname: str, path: Any = None, target: Any = None) -> None:
        entry = _entry(fullname)
        if entry is None:
            return None
        key, what = entry
        raise ArtInternalModuleError(
            f"`art.{key}` is one of ART's internal modules: {what}. "
            "groupwise keeps ART's public API (docs/porting-from-art.md lists it), not this machinery; "
            "remove the import and use what is named here.",
            name=fullname)

    @staticmethod
    def invalidate_caches() -> None:
        pass


def install() -> None:
    if not any(isinstance(finder, _ArtInternalsFinder) for finder in sys.meta_path):
        sys.meta_path.append(_ArtInternalsFinder())
