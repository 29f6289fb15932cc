"""One default per setting: a default that several signatures share is one named constant.

Checked on the source with `ast`: a literal repeated across signatures drifts (one copy changed, the
others not), which is how the backends' batch size and best-checkpoint metric could disagree."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "groupwise"


WRAPPERS = ("option", "arg", "Field")  # calls whose first argument is a field's default


class Code(str):
    """A default written as an expression (a constant's name, a call), not as a literal."""


def _defaults(name: str | None = None) -> list[tuple[str, object]] | dict[str, list[tuple[str, object]]]:
    """(file:line, default) of every parameter or field called `name` that has a default; without a name,
    every such list by name."""
    by_name: dict[str, list[tuple[str, object]]] = {}
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
                if isinstance(default, ast.Call) and ast.unparse(default.func) in WRAPPERS and default.args:
                    default = default.args[0]  # a config field: option(default, help=...), a job's arg, a Field
                value = default.value if isinstance(default, ast.Constant) else Code(ast.unparse(default))
                by_name.setdefault(arg, []).append((f"{path.relative_to(SRC)}:{default.lineno}", value))
    return by_name.get(name, []) if name is not None else by_name


# Equal literal defaults that are separate settings, or no setting at all, each with why.
SEPARATE = {
    "n_train": "each env's own split sizes (2048 and tic-tac-toe happen to agree)",
    "n_val": "each env's own split sizes",
    "n_test": "each env's own split sizes",
    "n": "different counts: `groupwise compare`'s answers shown, MCP's scenarios generated",
    "split": "'val' is a split's name in the history rows, which each reader shows first",
    "pbar_desc": "ART's two gather functions' progress labels, each ART's own",
    "off_policy": "the loss function's neutral value (no correction); TrainConfig owns the setting",
    "judge_key": "the metric the judge writes, named where it is read (the loop must not load the judge)",
    "models": "one run: the neutral count of a memory budget",
    "epochs": "one pass over the data, in ART's signatures, each its own",
    "num_epochs": "one pass over the data: LoopConfig's and ART's iterate_dataset's own",
    "temperature": "OpenAI's default for a request that names none; the envs' rollouts sample at 1.0 by choice",
    "max_tokens": "OpenAI's default for completions; the 2048 env's reply budget (a move tag is ~6 tokens)",
    "max_turns": "each env's own episode length",
}


def test_no_literal_default_is_written_twice():
    """A literal (number or string) default shared by two parameters or fields of the same name is one
    setting written twice, unless SEPARATE says why not: give it one owner (a constant, or the config
    field's default) and reference it."""
    twice = {}
    for name, found in _defaults().items():
        literal = [(where, v) for where, v in found if isinstance(v, (int, float, str))
                   and not isinstance(v, (bool, Code)) and v not in (0, "")]
        values = [v for _, v in literal]
        repeated = [(where, v) for where, v in literal if values.count(v) > 1]
        if repeated and name not in SEPARATE:
            twice[name] = repeated
    assert twice == {}


def test_the_detectors_thresholds_are_the_detector_configs():
    """Each detector called alone takes DetectorConfig's defaults: the signatures reference them."""
    import inspect

    from groupwise.config import DetectorConfig
    from groupwise.loop import detectors

    d = DetectorConfig()
    params = inspect.signature(detectors.val_drop).parameters
    assert (params["min_drop"].default, params["min_rise"].default, params["window"].default) == (
        d.val_drop, d.reward_rise, d.reward_window)
    params = inspect.signature(detectors.reward_jump).parameters
    assert (params["window"].default, params["min_jump"].default, params["sigmas"].default,
            params["plateau_range"].default) == (d.jump_window, d.jump_min, d.jump_sigmas, d.plateau_range)
    assert inspect.signature(detectors.identical_answers).parameters["share"].default == d.identical_share


def test_the_best_checkpoint_metric_has_one_owner():
    found = _defaults("best_checkpoint_metric")
    assert len(found) >= 3  # BackendOptions (every worker backend's), Backend and TrainableModel.delete_checkpoints
    assert [f for f in found if f[1] != "BEST_CHECKPOINT_METRIC"] == []
    from groupwise.backend.base import BEST_CHECKPOINT_METRIC

    assert BEST_CHECKPOINT_METRIC == "val/reward"  # ART's default


def test_the_engines_batch_size_has_one_owner():
    # (vLLM's engine batches far more, and ART's PipelineTrainer's max_batch_size counts groups)
    found = [f for f in _defaults("max_batch_size") if not f[0].startswith(("inference/vllm", "art/pipeline_trainer/"))]
    assert len(found) >= 4  # the Engine, BackendOptions (every worker backend's), Replica, the local judge
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
