"""ART's `load_trajectories`: every stored trajectory of a project as one polars DataFrame, a row each.

ART reads the Parquet files its backend writes; groupwise reads its run store, where the same things are
kept losslessly (``<store>/<project>/models/<name>/trajectories/<split>/<step>.jsonl``), into ART's columns:
``model``, ``split``, ``step``, ``reward``, ``group_number`` (numbered from 1 over the groups read, in
order), ``messages`` (role, content, tool_calls, trainable: True for a sampled Choice), ``logs``, and one
column per key seen: ``metric_<k>`` (float), ``metadata_<k>`` (text), ``group_metric_<k>``,
``group_metadata_<k>``. Prompted models logged with ``model.log(...)`` are runs of the store too, so
charts compare them with trained runs as in ART.
"""

from __future__ import annotations

from typing import Any

from groupwise.errors import MissingDependencyError
from groupwise.runs.step_summary import message_dict
from groupwise.runs.store import project_run_dirs, read_group_dicts, trajectory_files
from groupwise.art.utils.benchmarking.pull_model_trajectories import pull_model_trajectories
from groupwise.runs.output_dirs import art_path_or_default

__all__ = ["load_trajectories", "pull_model_trajectories", "trajectory_rows"]  # ART 0.3 defined the pull here


def trajectory_rows(project_name: str, models: list[str] | None = None,
                    art_path: str | None = None) -> list[dict[str, Any]]:
    """The rows of `load_trajectories` as dicts (no polars needed); runs sorted by name."""
    wanted = None if models is None else set(models)
    rows: list[dict[str, Any]] = []
    numbers: dict[tuple[str, str, int, int], int] = {}
    for run_dir in project_run_dirs(art_path_or_default(art_path), project_name):
        if wanted is not None and run_dir.name not in wanted:
            continue
        for split, step, path in trajectory_files(run_dir):
            for index, group in enumerate(read_group_dicts(path, skip_corrupt=True)):
                number = numbers.setdefault((run_dir.name, split, step, index), len(numbers) + 1)
                shared = {**_columns("group_metric_", group.get("metrics"), float),
                          **_columns("group_metadata_", group.get("metadata"), str)}
                for trajectory in group["trajectories"]:
                    rows.append({
                        "model": run_dir.name, "split": split, "step": step,
                        "reward": _number(trajectory.get("reward")), "group_number": number,
                        "messages": [_message(m) for m in trajectory.get("messages_and_choices") or []],
                        "logs": list(trajectory.get("logs") or []) or None,
                        **_columns("metric_", trajectory.get("metrics"), float),
                        **_columns("metadata_", trajectory.get("metadata"), str),
                        **shared,
                    })
    return rows


async def load_trajectories(project_name: str, models: list[str] | None = None, debug: bool = False,
                            art_path: str | None = None) -> Any:
    """A polars DataFrame of every stored trajectory of `project_name` (of the runs named in `models`,
    else of all); an empty frame when there is none. `art_path` is the store folder (default: this
    machine's, as the backend's). `debug` prints how many rows were read."""
    try:
        import polars as pl
    except ImportError as exc:
        raise MissingDependencyError("load_trajectories", "benchmarking", "polars") from exc
    rows = trajectory_rows(project_name, models, art_path)
    if debug:
        print(f"[groupwise] {len(rows)} trajectories of project {project_name!r}")
    if not rows:
        return pl.DataFrame()
    message = pl.Struct({"role": pl.Utf8, "content": pl.Utf8, "trainable": pl.Boolean,
                         "tool_calls": pl.List(pl.Struct({"function": pl.Struct({"name": pl.Utf8,
                                                                                   "arguments": pl.Utf8})}))})
    schema: dict[str, Any] = {"model": pl.Utf8, "split": pl.Utf8, "step": pl.Int64, "reward": pl.Float64,
                              "group_number": pl.Int64, "messages": pl.List(message), "logs": pl.List(pl.Utf8)}
    for row in rows:
        for key in row:
            if key not in schema:
                schema[key] = pl.Utf8 if key.startswith(("metadata_", "group_metadata_")) else pl.Float64
    return pl.DataFrame(rows, schema=schema)


def _columns(prefix: str, values: Any, kind: type) -> dict[str, Any]:
    if not isinstance(values, dict):
        return {}
    if kind is str:
        return {f"{prefix}{k}": str(v) for k, v in values.items()}
    return {f"{prefix}{k}": _number(v) for k, v in values.items()}


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _message(item: Any) -> dict[str, Any]:
    """A stored message or Choice as ART's flattened message: `groupwise.runs.step_summary.message_dict`'s
    reading (a Choice is its assistant message, trainable), with content None kept as None, as ART's."""
    if not isinstance(item, dict):
        return {"role": None, "content": None, "trainable": False, "tool_calls": None}
    message = message_dict(item)
    raw = (item.get("message") or {}) if message["sampled"] else item
    calls = [{"function": {"name": c["name"], "arguments": c["arguments"]}} for c in message["tool_calls"]]
    return {"role": message["role"], "content": None if raw.get("content") is None else message["content"],
            "trainable": message["sampled"], "tool_calls": calls or None}


def __getattr__(name: str) -> Any:
    # ART's names that are not provided say why (groupwise.core.compat.NOT_PROVIDED)
    from groupwise.core.compat import not_provided

    raise not_provided(__name__, name)
