"""One default per setting: a default that several signatures share is one named constant.

Checked on the source with `ast`: a literal repeated across signatures drifts (one copy changed, the
others not), which is how the backends' batch size and best-checkpoint metric could disagree."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "groupwise"


def _defaults(name: str) -> list[tuple[str, object]]:
    """(file:line, default) of every parameter or dataclass field called `name` that has a default."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            pairs = []
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                positional = args.posonlyargs + args.args
                pairs += list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
                pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
                pairs = [(a.arg, d) for a, d in pairs]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                pairs = [(node.target.id, node.value)]
            for arg, default in pairs:
                if isinstance(default, ast.Call) and ast.unparse(default.func) == "option" and default.args:
                    default = default.args[0]  # a config field: option(default, help=...)
                if arg == name:
                    value = default.value if isinstance(default, ast.Constant) else ast.unparse(default)
                    found.append((f"{path.relative_to(SRC)}:{default.lineno}", value))
    return found


def test_the_best_checkpoint_metric_has_one_owner():
    found = _defaults("best_checkpoint_metric")
    assert len(found) >= 3  # BackendOptions (every worker backend's), Backend and TrainableModel.delete_checkpoints
    assert [f for f in found if f[1] != "BEST_CHECKPOINT_METRIC"] == []
    from groupwise.backend.base import BEST_CHECKPOINT_METRIC

    assert BEST_CHECKPOINT_METRIC == "val/reward"  # ART's default


def test_the_backends_engine_batch_size_has_one_owner():
    found = [f for f in _defaults("max_batch_size") if f[0].startswith("backend/")]
    assert len(found) >= 3  # BackendOptions (every worker backend's), Replica, the local judge
    assert [f for f in found if f[1] != "DEFAULT_MAX_BATCH_SIZE"] == []


def test_the_base_model_and_run_store_have_one_owner():
    """TrainableModel's signature and every job that names a model or a run store share config.py's."""
    from groupwise.cli import COMMANDS
    from groupwise.config import DEFAULT_BASE_MODEL, DEFAULT_RUN_STORE
    from groupwise.jobs.fields import flags

    assert [f for f in _defaults("base_model") if f[1] != "DEFAULT_BASE_MODEL"] == []
    assert [f for f in _defaults("base_path") if f[1] != "DEFAULT_RUN_STORE"] == []
    shared = {(c.name, s.name): s.default for c in COMMANDS for s in flags(c.job) if s.name in ("model", "path")}
    assert shared[("train", "model")] == shared[("sft", "model")] == DEFAULT_BASE_MODEL
    assert shared[("train", "path")] == shared[("sft", "path")] == shared[("dashboard", "path")] == DEFAULT_RUN_STORE
