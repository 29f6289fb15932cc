"""ART's Parquet trajectory logs (`art.utils.trajectory_logging`): write groups as ART's backend writes
them, and read ART's files (or these) back as `TrajectoryGroup`s.

groupwise's own store keeps trajectories losslessly as JSON lines (`groupwise.store`); this format is
ART's: one row per trajectory (``group_index``, the group's metadata, metrics and logs, ``reward``,
``metrics``, ``metadata``, ``tools``, ``logs``, and ``messages``, each a role, content, tool calls as
JSON text, tool call id and ``trainable``: True for a sampled Choice). It keeps no token ids or logprobs,
so a group read back has plain messages where the Choices were (as ART's reader gives): enough to
inspect, judge, or fine-tune with SFT (`train_sft`), not to train GRPO on the sampled tokens. polars
reads and writes the files (the ``benchmarking`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from groupwise.errors import MissingDependencyError
from groupwise.types import Choice, Trajectory, TrajectoryGroup

__all__ = ["read_trajectory_groups_parquet", "write_trajectory_groups_parquet"]


def _polars() -> Any:
    try:
        import polars
    except ImportError as exc:
        raise MissingDependencyError("ART's Parquet trajectory logs", "benchmarking", "polars") from exc
    return polars


def _schema(pl: Any) -> dict[str, Any]:
    message = pl.Struct({"role": pl.Utf8, "content": pl.Utf8, "tool_calls": pl.Utf8, "tool_call_id": pl.Utf8,
                         "trainable": pl.Boolean})
    return {"group_index": pl.Int64, "group_metadata": pl.Utf8, "group_metrics": pl.Utf8, "group_logs": pl.List(pl.Utf8),
            "reward": pl.Float64, "metrics": pl.Utf8, "metadata": pl.Utf8, "tools": pl.Utf8, "logs": pl.List(pl.Utf8),
            "messages": pl.List(message)}


def _json(value: Any) -> str | None:
    return json.dumps(value) if value else None


def _flat(item: Any) -> dict[str, Any]:
    trainable = isinstance(item, Choice)
    message = item.message.model_dump(mode="json") if trainable else item
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, as the chat template reads them
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return {"role": message.get("role"), "content": content, "tool_calls": _json(message.get("tool_calls")),
            "tool_call_id": None if trainable else message.get("tool_call_id"), "trainable": trainable}


def write_trajectory_groups_parquet(trajectory_groups: list[TrajectoryGroup], path: str | Path) -> None:
    """Write `trajectory_groups` to the Parquet file `path` (zstd), one row per trajectory."""
    pl = _polars()
    rows = [{"group_index": index, "group_metadata": _json(group.metadata), "group_metrics": _json(group.metrics),
             "group_logs": list(group.logs) or None, "reward": trajectory.reward, "metrics": _json(trajectory.metrics),
             "metadata": _json(trajectory.metadata), "tools": _json(trajectory.tools),
             "logs": list(trajectory.logs) or None, "messages": [_flat(m) for m in trajectory.messages_and_choices]}
            for index, group in enumerate(trajectory_groups) for trajectory in group.trajectories]
    pl.DataFrame(rows, schema=_schema(pl)).write_parquet(str(path), compression="zstd")


def read_trajectory_groups_parquet(path: str | Path) -> list[TrajectoryGroup]:
    """The groups of an ART (or `write_trajectory_groups_parquet`) Parquet file, by group index."""
    pl = _polars()
    groups: dict[int, TrajectoryGroup] = {}
    for row in pl.read_parquet(str(path)).to_dicts():
        if row.get("reward") is None and row.get("messages") is None:
            continue
        index = int(row.get("group_index") or 0)
        if index not in groups:
            groups[index] = TrajectoryGroup([], metadata=_loads(row.get("group_metadata")),
                                            metrics=_loads(row.get("group_metrics")), logs=list(row.get("group_logs") or []))
        messages = []
        for m in row.get("messages") or []:
            message = {"role": m["role"], "content": m["content"]}
            if m.get("tool_calls"):
                message["tool_calls"] = json.loads(m["tool_calls"])
            if m.get("tool_call_id"):
                message["tool_call_id"] = m["tool_call_id"]
            messages.append(message)
        tools = json.loads(row["tools"]) if row.get("tools") else None
        groups[index].trajectories.append(Trajectory(
            messages_and_choices=messages, tools=tools, reward=row["reward"], metrics=_loads(row.get("metrics")),
            metadata=_loads(row.get("metadata")), logs=list(row.get("logs") or [])))
    return [groups[i] for i in sorted(groups)]


def _loads(text: Any) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
