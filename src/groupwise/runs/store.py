"""The run store: everything a run produced, on disk, as JSON. No torch, no pickle.

Layout (``run_dir = <base_path>/<project>/models/<model>``, ART's: a program that builds a run's paths
as ART does, by hand or with ``art.utils.output_dirs``, finds the files)::

    history.jsonl                     one row per (step, split, kind, name, message), appended
    trajectories/<split>/<step:04d>.jsonl
                                      one line per TrajectoryGroup, every field (see below)
    trajectories/<split>/<step:04d>.summary.json
                                      derived, for readers of many steps: step_summary.py
    state.json                        the user's small state (`write_state`, ART's `model.write_state`)
    checkpoints/<step>/               written by the trainer (adapter safetensors, optimizer, RNG, and
                                      in its own state.json the loop's data cursor of that step)
    .writer.lock                      flock'ed by the one process that trains the run (run_lock.py)

A run folder of the earlier layout, ``<base_path>/<project>/<model>`` (no ``models/``), is moved into
place the first time a `RunStore` opens that run (`run_dir_of`): one rename of the whole folder, so it
is lossless and atomic; a run another process is still training there is read where it is until then.

Trajectory files are lossless: a line is ``TrajectoryGroup.model_dump(mode="json")``, so every
Trajectory field (messages, Choices with their extra fields ``token_ids`` and ``logprobs``, tools,
additional histories, reward, metrics, metadata, logs, policy versions), the group's exceptions,
metadata, metrics and logs come back equal (``==``) from `load_trajectories`. Python's json writes
floats with repr (exact) and keeps inf/nan logprobs as ``Infinity``/``NaN``. Any string a model can
produce is storable: a lone surrogate is written as its escape ``\\ud800`` and read back as itself
(`groupwise.runs.history.dumps` names the two cases that do not round-trip).

History row schema (`history_row` builds it; the loop, plots and reports read it)::

    step            int    the policy version that produced the trajectories: train rows at step k
                           are the rollouts of policy k that trained step k -> k+1 (and that
                           update's training metrics); val rows at step k evaluate policy k
    split           str    "train", "val", "test", ...
    recorded_at     str    ISO 8601 UTC time of the write
    reward          float  mean reward over the split's trajectories (null when there are none)
    reward_std      float  population std (ddof=0) of those rewards (null when there are none)
    reward_std_within_group  float  mean over groups of each group's own reward std: near 0 means
                           GRPO sees no signal (every rollout of a scenario scored the same)
    reward_std_dev  float  ART's name and measure of the same: the mean population std of the rewards
                           of the groups with more than one trajectory (0 when there is none)
    n_groups, n_trajectories, n_exceptions   int
    exception_rate  float  n_exceptions / (n_trajectories + n_exceptions)
    <metric>        float  mean of a trajectory metric over the trajectories that report it
    group_<metric>  float  mean of a group metric over the groups that report it and hold trajectories
                           (as ART's: a group of exceptions only is left out)
    <key>           any    each key of ``metrics=`` passed to `Model.log` (e.g. the trainer's
                           ``loss``, ``grad_norm``), as given; one named like a field above
                           replaces it, as in ART (``metrics={"reward": score}`` for a validation
                           that scores its groups itself)

A trajectory or group metric named like a fixed field is an error, not a silent overwrite, and so is
a ``metrics=`` key named ``step``, ``split`` or ``recorded_at``.

Every number of a row is finite: JSON has no NaN or Infinity, and a reader would have to guess what one
meant (`RunHistory` refuses such a row, naming the field). A value that does not exist (the mean of no
trajectories) is null. A ``metrics=`` value that is nan or inf is refused with a `StoreError` naming
it (ours are computed to be finite: one that is not is a bug to report, not a number to chart); the
mean of a trajectory or group metric that a rollout set to nan or inf is written as null, with a
warning naming the metric (the rollout's value, not the run's).

Writes are atomic: a file is written to a temp file in the same folder, fsynced, then `os.replace`d
over the target, so a crash leaves the old file or the new one, never half of one.

History appends are idempotent: a row is identified by its step, split and, where it has them, its
``kind``, ``name`` and ``message`` (`history_key`); appending a row whose key is already there
replaces that row in place, so a step redone after a crash, or a row replayed from a checkpoint on
resume, is never counted twice. One object writes a run's history.jsonl, `RunHistory`
(groupwise/runs/history.py): the rows in memory, appended in time independent of the run's length, the file
written on one writer thread; `RunStore.run_history` is it, `RunStore.append_history` appends through it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import statistics
import warnings
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from groupwise.errors import (ArgumentTypeError, CorruptRecordError, GroupwiseWarning, RunFolderError, RunLockedError,
                              StoreError)
from groupwise.runs.history import RunHistory, atomic_write_text, dumps, history_key, load_history, read_jsonl
from groupwise.runs.lock import RunLock
from groupwise.runs.step_summary import summary_of, summary_path
from groupwise.core.trajectory import Trajectory, TrajectoryGroup

log = logging.getLogger(__name__)

__all__ = [
    "RunStore",
    "RunHistory",
    "RunLock",
    "folder_name_problem",
    "as_groups",
    "train_metrics",
    "history_key",
    "numeric_metrics",
    "load_trajectories",
    "load_history",
    "history_row",
    "metrics_row",
    "trajectory_files",
    "read_groups",
    "read_group_dicts",
    "atomic_write_text",
    "RESERVED_HISTORY_KEYS",
    "MAX_NESTING",
    "storable_problem",
    "checkpoint_folders",
    "dir_name_step",
    "run_dir_of",
    "project_run_dirs",
]

RESERVED_HISTORY_KEYS = frozenset({
    "step", "split", "recorded_at", "reward", "reward_std", "reward_std_within_group", "reward_std_dev",
    "n_groups", "n_trajectories", "n_exceptions", "exception_rate",
})

_ROW_IDENTITY = frozenset({"step", "split", "recorded_at"})
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+=-]*")  # fullmatch: `$` would let "name\n" through
_STEP_FILE = re.compile(r"([0-9]+)\.jsonl")
# a run folder's layout (module doc); the names code outside the store builds paths with
TRAJECTORIES_DIR = "trajectories"
CHECKPOINTS_DIR = "checkpoints"
MODELS_DIR = "models"  # a project's runs are in <base_path>/<project>/models/, as in ART


def step_dir_name(step: int) -> str:
    """A step's name in the run folder: its checkpoint folder, and its trajectory files' stem."""
    return f"{step:04d}"


def dir_name_step(name: str) -> int | None:
    """The step a folder's name gives (``"0012"`` -> 12), or None. ASCII digits only: str.isdigit() also
    takes "²", which int() refuses (a stray folder crashed every listing), and "٣", which int() reads as 3
    (a second step 3)."""
    return int(name) if name.isascii() and name.isdigit() else None


def checkpoint_folders(checkpoints_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, folder) of every numbered folder of a checkpoints folder, by step ([] when it does not
    exist). Complete or not: readers that need a complete checkpoint check its state.json."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    found = [(dir_name_step(d.name), d) for d in root.iterdir() if d.is_dir()]
    return sorted((step, d) for step, d in found if step is not None)


# Far below a file system's 255 bytes a name, and a model's served name (name@step) stays a model id
# the server takes.
MAX_FOLDER_NAME_CHARS = 128


def folder_name_problem(value: Any) -> str | None:
    """Why `value` cannot name a folder of the run store (a project, a model, a split), or None."""
    if (not isinstance(value, str) or not _NAME.fullmatch(value) or value in (".", "..")
            or len(value) > MAX_FOLDER_NAME_CHARS):
        return ("cannot be a folder name of the run store; use letters, digits and _ . @ + = - "
                f"(no slashes, not starting with a dot, at most {MAX_FOLDER_NAME_CHARS} characters)")
    return None


# Levels of nesting allowed inside one message, tool definition or additional history: far past any
# real tool schema (the server takes 32), and far enough below the writer's own bound (pydantic's JSON
# dump stops at about 255 levels from the group) and Python's recursion limit (the trainer's render
# key is a repr) that what is accepted here is written and trained.
MAX_NESTING = 100


def _json_problem(value: Any, nesting: int = 0) -> str | None:
    """Why `value` (a message, a tool, ...) cannot be written as JSON, or None. One walk, no recursion:
    nesting past MAX_NESTING, an integer whose decimal text Python refuses, or a value of another type
    that pydantic's JSON dump (the writer's) refuses."""
    from pydantic_core import to_jsonable_python

    stack = [(value, nesting)]
    while stack:
        v, depth = stack.pop()
        kind = type(v)
        if v is None or kind is str or kind is float or kind is bool:
            continue
        if depth > MAX_NESTING:
            return f"nests deeper than {MAX_NESTING} levels"
        if kind is int:
            if v.bit_length() > 14_000:  # 4214 digits: only then may str() refuse it
                try:
                    str(v)
                except ValueError:
                    return f"holds an integer of {v.bit_length()} bits, past Python's limit on integer text"
            continue
        if kind is dict:
            if not all(type(k) is str for k in v):
                try:
                    to_jsonable_python({k: None for k in v})
                except Exception as exc:
                    return f"has a key JSON cannot hold ({type(exc).__name__})"
            stack.extend((x, depth + 1) for x in v.values())
        elif kind is list or kind is tuple:
            stack.extend((x, depth + 1) for x in v)
        else:
            try:
                dumps(to_jsonable_python(v))
            except Exception as exc:  # pydantic's serialization errors, bytes that are not UTF-8, ...
                return f"holds a {kind.__name__} that cannot be written as JSON ({type(exc).__name__}: {str(exc)[:100]})"
    return None


_unstorable_said: set[str] = set()


def _metadata_problem(metadata: dict[str, Any], where: str) -> str | None:
    """Why `metadata` cannot be written, or None. Metadata takes any value (ART 0.5.23's): JSON is
    written as it is; a value JSON cannot hold (an object, a set of objects) is written as its repr(),
    said once per type (`metadata_as_text`), rather than refusing the step. What no text can stand for
    (nesting past MAX_NESTING, an integer past Python's limit on integer text, a key JSON cannot hold)
    is refused."""
    for key, value in metadata.items():
        problem = _json_problem(value, 1)
        if problem is None:
            continue
        if "cannot be written as JSON" not in problem:  # too deep, an integer past text, a key: no text form
            return f"{where}[{key!r}] {problem}{_JSON_ADVICE}"
        kind = type(value).__name__
        if kind not in _unstorable_said:
            _unstorable_said.add(kind)
            warnings.warn(GroupwiseWarning(
                f"{where}[{key!r}] {problem}: it is stored as its repr() (text), and read back as that text. "
                "Store a JSON form of it (a dict, list, str or number) to read it back as a value"), stacklevel=4)
    return None


def metadata_as_text(value: Any) -> str:
    """The stored form of a metadata value JSON cannot hold (pydantic's JSON dump's fallback)."""
    try:
        return repr(value)
    except Exception:  # a repr that raises: the type, at least
        return f"<{type(value).__name__}>"


def _metrics_problem(metrics: dict[str, Any]) -> str | None:
    for name, v in metrics.items():
        if isinstance(v, float) and not math.isfinite(v):
            return (f"metric {str(name)[:80]!r} is {v}; history rows hold finite numbers (a value that does not "
                    "exist is None)")
        if isinstance(v, int) and not isinstance(v, bool):
            try:
                float(v)
            except OverflowError:
                # written, it made every reader of the history that charts numbers (report, curves) crash
                return (f"metric {str(name)[:80]!r} is an integer past float's range ({v.bit_length()} bits); "
                        "history rows hold numbers a float can hold")
    return None


_JSON_ADVICE = (f": the run store could not write it. Keep messages, tools and metadata plain JSON (str, numbers, "
                f"lists, dicts) nested at most {MAX_NESTING} levels; convert other values in the rollout")


def _revalidation_problem(obj: Any, where: str, skip: tuple[str, ...] = ()) -> str | None:
    """Why `obj` (a Trajectory, History or TrajectoryGroup) fails its own model's validation now, or None.

    pydantic checks the values given when the object is built, not those a rollout sets into its dicts
    and lists afterwards (``t.metrics["x"] = None``, ``t.messages_and_choices.append(...)``); written
    as they are, those make a line that `read_groups` refuses, or none at all (a numpy scalar). A
    metric or metadata value that validation converts (a numpy scalar, a Decimal) is put back converted,
    as the constructor would have stored it. Fields named in `skip` are checked elsewhere (their items
    are models of their own). Choices pass through as they are (no re-parse)."""
    from pydantic import ValidationError

    cls = type(obj)
    try:
        checked = cls.model_validate({name: [] if name in skip else getattr(obj, name) for name in cls.model_fields})
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        loc = errors[0]["loc"]
        union = [e for e in errors if len(e["loc"]) > 1 and e["loc"][:-1] == loc[:-1]]
        if len(union) > 1:  # the members of a union tried one by one (bool, int, float): name the value
            loc, told = loc[:-1], union
        else:
            told = errors[:1]
        path = (where + "".join(f"[{p}]" if isinstance(p, int) else p if p == "[key]" else f".{p}"
                                for p in loc)).lstrip(".")
        msgs = list(dict.fromkeys(e["msg"].removeprefix("Value error, ") for e in told))
        msg = " or ".join([msgs[0], *(m.removeprefix("Input should be ") for m in msgs[1:])])
        return (f"{path}: {msg}. The value was set after the trajectory was built (pydantic checks what "
                "Trajectory(...) or TrajectoryGroup(...) is given, not what is put into its metrics, metadata, logs "
                "or messages later), and read back the record would fail; set a value of the field's type")
    for name in ("metrics", "metadata"):
        given, converted = getattr(obj, name, None), getattr(checked, name, None)
        if given is not None:
            for key, value in converted.items():
                if type(given[key]) is not type(value):
                    given[key] = value
    return None


def _clashing_metrics(t: Trajectory) -> list[str]:
    """Metric names of `t` that would replace a field of the history row (a ``reward`` metric equal to
    the reward is a copy of it, as ART's examples write, and adds nothing). `t` holds numbers only."""
    return sorted(name for name, value in t.metrics.items() if name in RESERVED_HISTORY_KEYS
                  and not (name == "reward" and float(value) == t.reward))


def _clash_message(names: list[str]) -> str:
    return (f"metric name(s) {names} clash with the history row's own fields {sorted(RESERVED_HISTORY_KEYS)}; "
            f"rename the metric (e.g. 'task_{names[0]}')")


def storable_problem(group: TrajectoryGroup) -> str | None:
    """Why the run store could not write `group` as a record it reads back (and its history row), or
    None; the place is named from the group (``trajectories[0].metrics.x``). Checked before a step
    trains on it, so a step never updates the adapter and then fails to store what it trained on."""
    for i, t in enumerate(group.trajectories):
        problem = _revalidation_problem(t, f"trajectories[{i}]", skip=("additional_histories",))
        for h, history in enumerate(t.additional_histories):
            problem = problem or _revalidation_problem(history, f"trajectories[{i}].additional_histories[{h}]")
        if problem:
            return problem
        parts: list[tuple[str, Any]] = [(f"trajectories[{i}].tools", t.tools)]
        parts += [(f"trajectories[{i}].messages_and_choices[{j}]", m)
                  for j, m in enumerate(t.messages_and_choices) if isinstance(m, dict)]
        for h, history in enumerate(t.additional_histories):
            parts.append((f"trajectories[{i}].additional_histories[{h}].tools", history.tools))
            parts += [(f"trajectories[{i}].additional_histories[{h}].messages_and_choices[{j}]", m)
                      for j, m in enumerate(history.messages_and_choices) if isinstance(m, dict)]
        for where, value in parts:
            problem = _json_problem(value)
            if problem:
                return f"{where} {problem}{_JSON_ADVICE}"
        problem = _metadata_problem(t.metadata, f"trajectories[{i}].metadata")
        if problem:
            return problem
        problem = _metrics_problem(t.metrics)
        if problem:
            return f"trajectories[{i}]: {problem}{_JSON_ADVICE}"
        clashes = _clashing_metrics(t)
        if clashes:
            return f"trajectories[{i}]: {_clash_message(clashes)}"
    problem = _revalidation_problem(group, "", skip=("trajectories",))
    if problem:
        return problem
    if (problem := _metadata_problem(group.metadata, "metadata")) is not None:
        return problem
    problem = _metrics_problem(group.metrics)
    return f"metrics: {problem}{_JSON_ADVICE}" if problem else None


def _check_name(kind: str, value: Any) -> str:
    problem = folder_name_problem(value)
    if problem:
        raise StoreError(f"{kind}={value!r} {problem}")
    return value


def numeric_metrics(metrics: dict[str, Any], prefix: str = "train_") -> dict[str, Any]:
    """The numeric metrics of a step for its history row; a name that clashes with the row's own
    fields (e.g. "reward") gets `prefix` rather than failing after the step was taken."""
    out: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[f"{prefix}{key}" if key in RESERVED_HISTORY_KEYS else key] = value
    return out


def _mean(values: list[float]) -> float | None:
    if not values:
        return None  # no value, not a number: the schema's null
    try:
        return math.fsum(values) / len(values)
    except OverflowError:  # finite values whose sum leaves float's range (rewards near 1e308): scale first
        return math.fsum(v / len(values) for v in values)


def history_row(
    groups: Iterable[TrajectoryGroup],
    *,
    step: int,
    split: str,
    metrics: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The history row (schema in this module's docstring) summarising `groups` at `step`."""
    if type(step).__module__ == "numpy" and hasattr(step, "item"):
        step = step.item()  # a step counted with numpy is an int like any other
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        # int(step) took "5", 5.7 (as 5) and -1: a row at a step no checkpoint or trajectory file can have
        raise StoreError(f"step={step!r} must be an int >= 0 (a policy version: a run's steps count from 0)")
    problem = _metrics_problem(metrics or {})
    if problem:
        raise StoreError(f"{problem}. Log it as a float or a smaller unit")
    groups = list(groups)
    trajectories = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories]
    n_exc = sum(len(g.exceptions) for g in groups)
    n_total = len(trajectories) + n_exc
    within = [statistics.pstdev(g.rewards()) for g in groups if len(g.trajectories) >= 1]
    # ART's reward_std_dev (calculate_step_std_dev, ART 0.3 - 0.5): groups of one are left out
    spread = [statistics.pstdev(g.rewards()) for g in groups if len(g.trajectories) > 1]
    row: dict[str, Any] = {
        "step": int(step),
        "split": split,
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
        "reward": _mean(rewards),
        "reward_std": statistics.pstdev(rewards) if rewards else None,
        "reward_std_within_group": _mean(within),
        "reward_std_dev": _mean(spread) if spread else 0.0,
        "n_groups": len(groups),
        "n_trajectories": len(trajectories),
        "n_exceptions": n_exc,
        "exception_rate": n_exc / n_total if n_total else 0.0,
    }
    extra: dict[str, Any] = {}
    traj_values: dict[str, list[float]] = {}
    for t in trajectories:
        for name, value in t.metrics.items():
            if name == "reward" and float(value) == t.reward:
                continue  # a copy of the reward (ART pools the two into one mean): the row has it
            traj_values.setdefault(name, []).append(float(value))
    group_values: dict[str, list[float]] = {}
    for g in groups:
        if not g.trajectories:  # ART 0.5 averages a group metric over the groups that hold trajectories
            continue
        for name, value in g.metrics.items():
            group_values.setdefault(f"group_{name}", []).append(float(value))
    for source in (traj_values, group_values):
        for name, values in source.items():
            extra[name] = _mean(values)
            if not math.isfinite(extra[name]):  # a rollout's nan or inf (module doc): no number to chart
                bad = sum(1 for v in values if not math.isfinite(v))
                warnings.warn(f"step {step} ({split}): metric {name!r} is nan or inf on {bad} of {len(values)} "
                              "trajectories or groups; its mean is written as null. Set a metric the rollout "
                              "cannot compute to None or leave it out", GroupwiseWarning, stacklevel=2)
                extra[name] = None
    clashes = sorted(set(extra) & RESERVED_HISTORY_KEYS)
    if clashes:
        raise StoreError(_clash_message(clashes))
    # The caller's own metrics come last and replace what the row computed (ART's model.log: a validation
    # that scores its groups itself logs ``metrics={"reward": score}``), except the row's identity.
    fixed = sorted(set(metrics or {}) & _ROW_IDENTITY)
    if fixed:
        raise StoreError(f"metric name(s) {fixed} name the history row itself; pass them as log()'s own "
                         "arguments (step=, split=) or rename the metric")
    row.update(extra)
    row.update(metrics or {})
    return row


def metrics_row(*, step: int, split: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """A history row of `metrics` alone (no trajectories, so no reward fields): an SFT step's, or
    ART's ``model.log(metrics=..., step=...)``."""
    row = history_row([], step=step, split=split, metrics=metrics)
    return {k: v for k, v in row.items() if k in ("step", "split", "recorded_at") or k in metrics}


def trajectory_files(run_dir: str | os.PathLike, split: str | None = None,
                     step: int | None = None) -> list[tuple[str, int, Path]]:
    """(split, step, path) of every trajectory file, sorted by split then step."""
    root = Path(run_dir) / TRAJECTORIES_DIR
    if not root.is_dir():
        return []
    out: list[tuple[str, int, Path]] = []
    for split_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if split is not None and split_dir.name != split:
            continue
        for f in split_dir.iterdir():
            m = _STEP_FILE.fullmatch(f.name)
            if m and (step is None or int(m.group(1)) == step):
                out.append((split_dir.name, int(m.group(1)), f))
    out.sort(key=lambda x: (x[0], x[1]))
    return out


def read_groups(path: str | os.PathLike, *, skip_corrupt: bool = False) -> list[TrajectoryGroup]:
    """The groups of one trajectory file, in line order."""
    path = Path(path)
    groups: list[TrajectoryGroup] = []
    for n, obj in read_jsonl(path, skip_corrupt):
        try:
            groups.append(TrajectoryGroup.model_validate(obj))
        except Exception as exc:  # pydantic ValidationError, or a non-dict line
            first = str(exc).strip().splitlines()
            reason = "; ".join(first[:3]) if first else type(exc).__name__
            if not skip_corrupt:
                raise CorruptRecordError(str(path), n, f"not a TrajectoryGroup: {reason}") from exc
            warnings.warn(f"{path}:{n}: skipped (not a TrajectoryGroup: {first[0] if first else reason})",
                          GroupwiseWarning, stacklevel=2)
    return groups


def read_group_dicts(path: str | os.PathLike, *, skip_corrupt: bool = False, warn: bool = True) -> list[dict[str, Any]]:
    """The groups of one trajectory file as the JSON objects stored, in line order, NOT validated.

    For readers that need a few fields of many files (a search, a ranking): validating a group builds
    every token's logprob entry, which costs far more than the JSON itself. Only the shape is checked
    (an object whose ``trajectories`` is a list of objects), so line numbers match `read_groups`' on
    a sound file; a value that `read_groups` would refuse is returned as stored. A line that is not
    such an object raises `CorruptRecordError`, or with `skip_corrupt` is skipped with a warning (none
    when not `warn`: `read_jsonl`)."""
    path = Path(path)
    out: list[dict[str, Any]] = []
    for n, obj in read_jsonl(path, skip_corrupt, warn=warn):
        trajs = obj.get("trajectories", []) if isinstance(obj, dict) else None
        if not isinstance(trajs, list) or not all(isinstance(t, dict) for t in trajs):
            if not skip_corrupt:
                raise CorruptRecordError(str(path), n, "not a TrajectoryGroup: expected an object with a list "
                                         "of trajectory objects")
            if warn:
                warnings.warn(f"{path}:{n}: skipped (not a TrajectoryGroup)", GroupwiseWarning, stacklevel=2)
            continue
        out.append(obj)
    return out


def write_step_summary(step_file: Path, rows: list[dict[str, Any]]) -> None:
    """The step's summary beside its file (what a search over many steps reads instead of the tokens;
    `groupwise.runs.step_summary` says how a reader tells a stale one)."""
    atomic_write_text(summary_path(step_file), dumps(summary_of(step_file, rows)) + "\n")


# How deep under a folder runs are looked for (<base_path>/<project>/models/<model> is depth 3).
MAX_DEPTH = 3
_RUN_DIR_HELP = "<base_path>/<project>/models/<model>, e.g. .groupwise/2048/models/2048-s0"


def is_run_dir(path: Path) -> bool:
    """A run folder: it has a history or trajectories, or a writer lock (a run that is loading its model
    or validating its base before anything is written)."""
    return (path / "history.jsonl").is_file() or (path / TRAJECTORIES_DIR).is_dir() or (path / RunLock.FILE).is_file()


def find_runs(root: Path) -> list[Path]:
    """Every run folder at or under `root` (a run, a project, or a base path), sorted by path."""
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        if is_run_dir(d):
            found.append(d)
            return
        if depth >= MAX_DEPTH:
            return
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            walk(child, depth + 1)

    if root.is_dir():
        walk(root, 0)
    return found


def run_dir_problem(run_dir: str | os.PathLike) -> str | None:
    """Why `run_dir` is not a run folder to read, with the runs it holds when it is a base path or a
    project (what a reader was likely pointed at), or None."""
    path = Path(run_dir).expanduser()
    if not path.exists():
        return f"does not exist; pass a run folder {_RUN_DIR_HELP}"
    if not path.is_dir():
        return f"is a file; pass a run folder {_RUN_DIR_HELP}"
    if is_run_dir(path):
        return None
    runs = [r.relative_to(path).as_posix() for r in find_runs(path)]
    if not runs:
        return f"holds no run (no history.jsonl or trajectories/ at or below it); pass a run folder {_RUN_DIR_HELP}"
    shown = ", ".join(runs[:5]) + (f" and {len(runs) - 5} more" if len(runs) > 5 else "")
    return f"is not a run folder; the runs under it: {shown}; pass one, e.g. {path / runs[0]}"


def load_trajectories(run_dir: str | os.PathLike, split: str | None = None, step: int | None = None,
                      *, skip_corrupt: bool = False) -> list[TrajectoryGroup]:
    """Every stored group of `run_dir` (optionally of one split and/or step), by split, step, line.

    A line that does not parse raises `CorruptRecordError` naming the file and line; with
    `skip_corrupt=True` such lines are skipped and the rest is read.
    """
    if not Path(run_dir).is_dir():
        raise StoreError(f"run folder {str(run_dir)!r} does not exist; expected {_RUN_DIR_HELP}")
    return [g for _, _, path in trajectory_files(run_dir, split, step) for g in read_groups(path, skip_corrupt=skip_corrupt)]


def run_dir_of(base_path: str | os.PathLike, project: str, model: str) -> Path:
    """The run folder of (`project`, `model`) under `base_path`: ``<base_path>/<project>/models/<model>``,
    ART's layout. A run of the earlier layout, ``<base_path>/<project>/<model>``, is moved there first
    (module doc), unless another process holds its writer lock or the folder cannot be moved (a
    read-only store): then that folder is the run's, and is read where it is."""
    project_dir = Path(base_path) / _check_name("project", project)
    new = project_dir / MODELS_DIR / _check_name("model name", model)
    legacy = project_dir / model
    if model == MODELS_DIR:  # the earlier run named "models" is the folder the new layout's runs go in
        return _migrate_into_parent(legacy, new) if _legacy_files(legacy) else new
    if new.exists() or not is_run_dir(legacy):
        if new.exists() and is_run_dir(legacy):
            _warn_both(legacy, new)
        return new
    with _legacy_writer_lock(legacy) as free:
        if not free:
            _warn_kept(legacy, "another process is writing it (its .writer.lock is held); it moves when that "
                       "process has stopped and the run is next opened")
            return legacy
        try:
            new.parent.mkdir(exist_ok=True)
            os.rename(legacy, new)  # one rename: the whole run moves, or nothing does
        except OSError as exc:
            _warn_kept(legacy, f"it could not be moved ({exc.strerror or exc}); make the store writable to move it")
            return legacy
    log.info("moved run folder %s to ART's layout at %s", legacy, new)
    return new


def _legacy_files(folder: Path) -> list[Path]:
    """The entries of an earlier-layout run named "models" that are its own (not the runs of the new
    layout, which live beside them in the same folder)."""
    if not folder.is_dir() or not ((folder / "history.jsonl").is_file() or (folder / TRAJECTORIES_DIR).is_dir()
                                   or (folder / CHECKPOINTS_DIR).is_dir() or (folder / "state.json").is_file()):
        return []
    return [p for p in folder.iterdir() if not (p.is_dir() and is_run_dir(p))]


def _migrate_into_parent(legacy: Path, new: Path) -> Path:
    """Moves the earlier run named "models" into ``models/models``, entry by entry (its folder stays:
    it is the new layout's `models/`); an interrupted move is finished when the run is next opened."""
    with _legacy_writer_lock(legacy) as free:
        if not free:
            _warn_kept(legacy, "another process is writing it (its .writer.lock is held)")
            return legacy
        try:
            new.mkdir(exist_ok=True)
            for entry in _legacy_files(legacy):
                if entry != new and not (new / entry.name).exists():  # a name already moved is kept
                    os.rename(entry, new / entry.name)  # the held lock file too: a flock follows its file
        except OSError as exc:
            _warn_kept(legacy, f"it could not be moved ({exc.strerror or exc}); make the store writable to move it")
            return legacy
    return new


class _legacy_writer_lock:
    """Holds an earlier-layout run's writer lock while it moves; `free` is False when another process
    (or another backend of this one) holds it."""

    def __init__(self, run_dir: Path) -> None:
        self.lock = RunLock(run_dir)

    def __enter__(self) -> bool:
        if not self.lock.path.is_file():
            return True
        try:
            self.lock.acquire()
        except RunLockedError:
            return False
        except RunFolderError:  # a read-only store: the move fails too, and says so
            pass
        return True

    def __exit__(self, *exc: Any) -> None:
        self.lock.release()


def _warn_kept(legacy: Path, why: str) -> None:
    warnings.warn(f"run folder {legacy} is in groupwise's earlier layout and stays there for now: {why}. "
                  f"Its new place is {legacy.parent / MODELS_DIR / legacy.name} (ART's layout)",
                  GroupwiseWarning, stacklevel=4)


def _warn_both(legacy: Path, new: Path) -> None:
    warnings.warn(f"run folder {legacy} (groupwise's earlier layout) is not read: the run's folder is {new}. "
                  "A process of an earlier groupwise wrote it after the run moved; merge or remove it",
                  GroupwiseWarning, stacklevel=4)


def project_run_dirs(base_path: str | os.PathLike, project: str) -> list[Path]:
    """Every run folder of `project` under `base_path`, sorted by run name: those of ART's layout and
    those of the earlier one (moved into place on the way, `run_dir_of`)."""
    project_dir = Path(base_path) / project
    if not project_dir.is_dir():
        return []
    names = {p.name for p in (project_dir / MODELS_DIR).iterdir() if p.is_dir()} \
        if (project_dir / MODELS_DIR).is_dir() else set()
    names |= {p.name for p in project_dir.iterdir() if p.is_dir() and p.name != MODELS_DIR and is_run_dir(p)}
    if _legacy_files(project_dir / MODELS_DIR):
        names.add(MODELS_DIR)
    return [run_dir_of(base_path, project, name) for name in sorted(names) if folder_name_problem(name) is None]


class RunStore:
    """One run's folder, ``<base_path>/<project>/models/<model>``: trajectories, history, state,
    checkpoints (`run_dir_of` moves a run of the earlier layout into place when it opens it)."""

    def __init__(self, base_path: str | os.PathLike, project: str, model: str) -> None:
        self.base_path = Path(base_path)
        self.project = _check_name("project", project)
        self.model = _check_name("model name", model)
        self.run_dir = run_dir_of(self.base_path, project, model)
        self._history: RunHistory | None = None

    def __repr__(self) -> str:
        return f"RunStore({str(self.run_dir)!r})"

    def lock(self) -> RunLock:
        """The folder's writer lock (`RunLock`), not yet taken: ``store.lock().acquire()``."""
        return RunLock(self.run_dir)

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / CHECKPOINTS_DIR

    @property
    def history_path(self) -> Path:
        return self.run_dir / "history.jsonl"

    @property
    def state_path(self) -> Path:
        return self.run_dir / "state.json"

    def trajectories_path(self, split: str, step: int) -> Path:
        _check_name("split", split)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise StoreError(f"step={step!r} must be an int >= 0")
        return self.run_dir / TRAJECTORIES_DIR / split / f"{step_dir_name(step)}.jsonl"

    @staticmethod
    def check_storable(groups: Iterable[TrajectoryGroup]) -> list[TrajectoryGroup]:
        """The groups as a list, or the error `write_trajectories` would raise for them (cheap: a caller
        that writes them on another thread meanwhile checks here first)."""
        groups = list(groups)
        for n, g in enumerate(groups):
            if not isinstance(g, TrajectoryGroup):
                raise ArgumentTypeError(f"groups[{n}] is {type(g).__name__}; write_trajectories takes TrajectoryGroups")
            if g.pending:
                raise StoreError(
                    f"groups[{n}] still has {len(g.pending)} rollouts that were never run; "
                    "await it (or gather_trajectory_groups) before storing it"
                )
            problem = storable_problem(g)
            if problem:
                raise StoreError(f"groups[{n}].{problem}. The group is refused before any step trains on it")
        return groups

    def write_trajectories(self, split: str, step: int, groups: Iterable[TrajectoryGroup]) -> Path:
        """Write the groups of (split, step) to their file, atomically; rewrites it if it exists
        (a resumed run re-logs the step it crashed in)."""
        path = self.trajectories_path(split, step)
        rows, lines = [], []
        for g in self.check_storable(groups):
            rows.append(g.model_dump(mode="json", fallback=metadata_as_text))  # only metadata gets here
            lines.append(dumps(rows[-1]) + "\n")
        atomic_write_text(path, "".join(lines))
        write_step_summary(path, rows)
        return path

    @property
    def run_history(self) -> RunHistory:
        """The run's history in memory and its one writer (`groupwise.runs.history.RunHistory`): what the
        process that trains the run reads and appends (one per folder per process)."""
        if self._history is None:
            self._history = RunHistory.of(self.run_dir)
        return self._history

    def append_history(self, row: dict[str, Any], *, if_missing: bool = False) -> bool:
        """Append `row`, or replace the row with its key (`history_key`) in place: idempotent (module
        doc). With `if_missing`, a row whose key is already there is left as it is. Returns whether
        the history changed, once the row is on disk. Async code awaits ``run_history.write(row)``."""
        return self.run_history.append(row, if_missing=if_missing)

    def history(self, *, skip_corrupt: bool = False) -> list[dict[str, Any]]:
        """history.jsonl as the file holds it, parsed anew (`load_history`); a training process reads
        `run_history` instead."""
        return load_history(self.run_dir, skip_corrupt=skip_corrupt)

    def load_trajectories(self, split: str | None = None, step: int | None = None,
                          *, skip_corrupt: bool = False) -> list[TrajectoryGroup]:
        if not self.run_dir.is_dir():
            return []
        return load_trajectories(self.run_dir, split, step, skip_corrupt=skip_corrupt)

    def read_state(self) -> dict[str, Any]:
        """state.json as a dict ({} before the first write)."""
        if not self.state_path.exists():
            return {}
        from groupwise.core.readers import RowError, kind_of, read_json_file

        try:  # the run's own state, any JSON a program stored (NaN included, as written): allow_nan
            state = read_json_file(self.state_path, expected="a JSON object", allow_nan=True)
        except RowError as exc:
            raise CorruptRecordError(exc.path, exc.line, exc.problem) from None
        if not isinstance(state, dict):
            raise CorruptRecordError(str(self.state_path), 1, f"state must be a JSON object, not {kind_of(state)}")
        return state

    def write_state(self, state: dict[str, Any]) -> None:
        atomic_write_text(self.state_path, json.dumps(state, indent=2, sort_keys=True, allow_nan=True) + "\n")


def as_groups(items: Iterable[Trajectory | TrajectoryGroup | BaseException]) -> list[TrajectoryGroup]:
    """Groups from a mix of groups and loose trajectories or exceptions (loose ones form one group)."""
    groups: list[TrajectoryGroup] = []
    loose: list[Trajectory | BaseException] = []
    for n, item in enumerate(items):
        if isinstance(item, TrajectoryGroup):
            groups.append(item)
        elif isinstance(item, (Trajectory, BaseException)):
            loose.append(item)
        else:
            raise ArgumentTypeError(f"item {n} is {type(item).__name__}; expected a Trajectory, a TrajectoryGroup "
                                    "or an exception")
    if loose:
        groups.append(TrajectoryGroup(loose))
    return groups


def train_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The trainer's numeric metrics for the history row; a name that clashes with the row's own
    fields (e.g. "reward") gets a ``train_`` prefix rather than failing after the step was taken."""
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            log.warning("train metric %r=%r is not a number; left out of the history row", key, value)
    return numeric_metrics(metrics)
