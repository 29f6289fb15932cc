"""ART's trajectory logs (`art.utils.trajectory_logging`): ART 0.5's Parquet files, and ART 0.1-0.4's JSON
lines (`serialize_trajectory_groups` / `deserialize_trajectory_groups` and their dict converters), written
as ART wrote them and read back as `TrajectoryGroup`s.

ART 0.1-0.4's lines are ``{"trajectories": [...]}`` per group, each Choice a dict without its logprobs;
groupwise's own store lines (`groupwise.runs.store`) hold the same keys and more, so either reads the other's.

groupwise's own store keeps trajectories losslessly as JSON lines (`groupwise.runs.store`); this format is
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

from groupwise.errors import InvalidDataError, MissingDependencyError
from groupwise.core.trajectory import Choice, History, Trajectory, TrajectoryGroup

__all__ = ["deserialize_trajectory_groups", "dict_to_message_or_choice", "dict_to_trajectory", "dict_to_trajectory_group",
           "history_to_dict", "message_or_choice_to_dict", "read_trajectory_groups_parquet",
           "serialize_trajectory_groups", "trajectory_group_to_dict", "trajectory_to_dict",
           "write_trajectory_groups_parquet"]


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


# ------------------------------------------------------------------ ART 0.1-0.4's JSON lines
def message_or_choice_to_dict(message_or_choice: Any) -> dict[str, Any]:
    """A message as it is; a Choice as its dict without logprobs."""
    item = dict(message_or_choice) if isinstance(message_or_choice, dict) else message_or_choice.to_dict()
    item.pop("logprobs", None)
    return item


def history_to_dict(history: History) -> dict[str, Any]:
    return {"messages_and_choices": [message_or_choice_to_dict(m) for m in history.messages_and_choices],
            "tools": history.tools}


def trajectory_to_dict(trajectory: Trajectory) -> dict[str, Any]:
    return {"reward": trajectory.reward, "metrics": trajectory.metrics, "metadata": trajectory.metadata,
            "messages_and_choices": [message_or_choice_to_dict(m) for m in trajectory.messages_and_choices],
            "tools": trajectory.tools,
            "additional_histories": [history_to_dict(h) for h in trajectory.additional_histories],
            "logs": trajectory.logs}


def trajectory_group_to_dict(trajectory_group: TrajectoryGroup) -> dict[str, Any]:
    return {"trajectories": [trajectory_to_dict(t) for t in trajectory_group.trajectories if isinstance(t, Trajectory)]}


def serialize_trajectory_groups(trajectory_groups: list[TrajectoryGroup]) -> str:
    """One JSON line per group (ART 0.1-0.4's trajectory files)."""
    return "\n".join(json.dumps(trajectory_group_to_dict(g)) for g in trajectory_groups)


# The three readers' parameter is named `dict`, as ART's, so that a call by keyword works the same.
def dict_to_message_or_choice(dict: dict[str, Any]) -> Any:  # noqa: A002
    return Choice(**dict) if "message" in dict else dict


def dict_to_trajectory(dict: dict[str, Any]) -> Trajectory:  # noqa: A002
    return Trajectory(messages_and_choices=[dict_to_message_or_choice(m) for m in dict["messages_and_choices"]],
                      reward=dict["reward"], metrics=dict.get("metrics") or {}, metadata=dict.get("metadata") or {},
                      tools=dict.get("tools"), logs=dict.get("logs") or [])


def dict_to_trajectory_group(dict: dict[str, Any]) -> TrajectoryGroup:  # noqa: A002
    return TrajectoryGroup([dict_to_trajectory(t) for t in dict["trajectories"]])


def deserialize_trajectory_groups(serialized: str) -> list[TrajectoryGroup]:
    """The groups of ART 0.1-0.4's JSON lines (or groupwise's store lines); ART's oldest YAML files too,
    where PyYAML is installed."""
    try:
        loaded = [json.loads(line) for line in serialized.strip().split("\n") if line.strip()]
    except json.JSONDecodeError:
        try:
            import yaml
        except ImportError as exc:
            raise InvalidDataError("these trajectory groups are neither JSON lines nor readable YAML (PyYAML is "
                                   "not installed: pip install pyyaml for ART's oldest YAML files)") from exc
        loaded = yaml.safe_load(serialized) or []
    return [dict_to_trajectory_group(group) for group in loaded]
