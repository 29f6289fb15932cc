"""The summary beside each trajectory file: what readers that span many steps (a text search over a
run, filters by reward or step, the best rollouts of all steps, two steps compared, the judge's
agreement, a step's groups) need of a step, without its tokens.

``trajectories/<split>/<step:04d>.summary.json`` is written by `RunStore.write_trajectories` right after
the step file it summarises (`summary_of`). Parsing a step file is dominated by each sampled turn's
token logprob entries (most of its bytes once turns are a few hundred tokens long), which none of those
readers look at: reading a summary costs a tenth of reading its step, so a cold search over a long run
takes a fraction of a second instead of seconds.

The step file stays the record (lossless, unchanged; a reader that does not know summaries ignores
them: `store.trajectory_files` lists ``<step>.jsonl`` only). A summary is derived data and is trusted
only while it describes the file beside it: it names the file's size, modification time and BLAKE2b
digest. `read_summary` returns None (the caller parses the step file, `summarize` of its rows) when
there is no summary (a run written before summaries existed), when it is of another format version,
or when the step file changed after it (a crash between the two writes, or code that does not write
summaries rewrote the step). A copied run folder (new modification times) is checked by its digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["PREVIEW_CHARS", "SUMMARY_VERSION", "answer_of", "content_text", "message_dict", "prompt_of", "read_summary", "summarize",
           "summary_of", "summary_path", "tool_calls"]

SUMMARY_VERSION = 1
# The answer and prompt previews are cut to this many characters (the search text is whole).
PREVIEW_CHARS = 200


def summary_path(step_file: str | os.PathLike) -> Path:
    """``0007.jsonl`` -> ``0007.summary.json`` in the same folder."""
    p = Path(step_file)
    return p.with_name(p.name.removesuffix(".jsonl") + ".summary.json")


def content_text(content: Any) -> str:
    """A message's content as text: a string as is, multimodal parts as their text (``[image_url]`` for others)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                parts.append(f"[{part.get('type', 'part') if isinstance(part, dict) else type(part).__name__}]")
        return "\n".join(parts)
    return str(content)


def tool_calls(calls: Any) -> list[dict[str, str]]:
    """Tool calls (stored dicts or openai objects) as [{id, name, arguments}]."""
    out = []
    for call in calls or []:
        if not isinstance(call, dict):
            call = call.model_dump() if hasattr(call, "model_dump") else {}
        fn = call.get("function") or {}
        out.append({"id": str(call.get("id", "")), "name": str(fn.get("name", "?")),
                    "arguments": str(fn.get("arguments", ""))})
    return out


def message_dict(item: dict[str, Any]) -> dict[str, Any]:
    """A stored message, or a stored Choice (a dict with ``message`` and ``finish_reason``, the keys
    `groupwise.types` tells a Choice by), as {role, content, tool_calls, sampled, ...}."""
    if "message" in item and "finish_reason" in item:
        msg = item["message"] if isinstance(item["message"], dict) else {}
        return {"role": "assistant", "content": content_text(msg.get("content")), "sampled": True,
                "tool_calls": tool_calls(msg.get("tool_calls")), "finish_reason": item["finish_reason"]}
    return {"role": str(item.get("role", "?")), "content": content_text(item.get("content")), "sampled": False,
            "tool_calls": tool_calls(item.get("tool_calls")), "tool_call_id": item.get("tool_call_id"),
            "name": item.get("name")}


def answer_of(msgs: list[dict[str, Any]]) -> str:
    """The last assistant turn's text and tool calls on one line."""
    for msg in reversed(msgs):
        if msg["role"] == "assistant":
            calls = " ".join(f"{c['name']}({c['arguments']})" for c in msg["tool_calls"])
            return " ".join(f"{msg['content']} {calls}".split())
    return ""


def prompt_of(msgs: list[dict[str, Any]]) -> str:
    """The last user message's text on one line."""
    users = [m for m in msgs if m.get("role") == "user"]
    return " ".join(content_text(users[-1].get("content")).split()) if users else ""


def _reward(traj: dict[str, Any]) -> float:
    r = traj.get("reward", 0.0)
    return float(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else 0.0


def _search_text(msgs: list[dict[str, Any]], logs: list[Any]) -> str:
    parts = []
    for msg in msgs:
        parts.append(msg["content"])
        parts.extend(c["name"] + " " + c["arguments"] for c in msg["tool_calls"])
    parts.extend(str(x) for x in logs)
    return "\n".join(parts)


def summarize(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of a step's groups as stored (``TrajectoryGroup.model_dump(mode="json")``, or
    `store.read_group_dicts`' rows): per group its scenario (``scenario_index`` metadata, else its
    position), prompt preview, exceptions (``type: message``), logs and metadata; per trajectory its reward, metrics, answer preview and searchable text
    (messages, tool calls and logs, where the judge writes its explanation) in lower case: a search
    ignores case, and lower-casing 10,000 texts on every cold search would cost as much as reading them."""
    out_groups: list[dict[str, Any]] = []
    out_trajs: list[dict[str, Any]] = []
    for gi, g in enumerate(groups):
        trajs = [t for t in g.get("trajectories") or [] if isinstance(t, dict)]
        meta = g.get("metadata")
        first = [m for m in (trajs[0].get("messages_and_choices") or []) if isinstance(m, dict)] if trajs else []
        excs = [e for e in g.get("exceptions") or [] if isinstance(e, dict)]
        logs = g.get("logs")
        out_groups.append({"scenario": meta.get("scenario_index", gi) if isinstance(meta, dict) else gi,
                           "prompt": prompt_of(first)[:PREVIEW_CHARS], "n": len(trajs),
                           "exceptions": [f"{e.get('type', '?')}: {e.get('message', '')}" for e in excs],
                           "logs": [str(x) for x in logs] if isinstance(logs, list) else [],
                           "metadata": dict(meta) if isinstance(meta, dict) else {}})
        for ti, t in enumerate(trajs):
            msgs = [message_dict(m) for m in t.get("messages_and_choices") or [] if isinstance(m, dict)]
            metrics = t.get("metrics")
            logs = t.get("logs")
            out_trajs.append({"group": gi, "index": ti, "reward": _reward(t),
                              "metrics": dict(metrics) if isinstance(metrics, dict) else {},
                              "answer": answer_of(msgs)[:PREVIEW_CHARS],
                              "text": _search_text(msgs, logs if isinstance(logs, list) else []).lower()})
    return {"groups": out_groups, "trajectories": out_trajs}


def _digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def summary_of(step_file: str | os.PathLike, groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary file's object for `groups`, the rows just written to `step_file`: it names the step
    file's size, modification time and digest as they are now (`RunStore.write_trajectories` writes it
    to `summary_path`, as JSON the way it writes the step)."""
    step_file = Path(step_file)
    st = step_file.stat()
    return {"format": "groupwise.step-summary", "version": SUMMARY_VERSION,
            "of": {"name": step_file.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "blake2b": _digest(step_file)},
            **summarize(groups)}


def read_summary(step_file: str | os.PathLike) -> dict[str, Any] | None:
    """The summary of `step_file` ({groups, trajectories} as `summarize` builds it), or None where there is
    none that describes the file as it is now (module doc: the caller then parses the step file)."""
    step_file = Path(step_file)
    try:
        with open(summary_path(step_file), encoding="utf-8") as f:
            body = json.load(f)
        st = step_file.stat()
    except (OSError, ValueError):
        return None  # none written (older code), or unreadable: the step file is the record
    if not isinstance(body, dict) or body.get("version") != SUMMARY_VERSION or not isinstance(body.get("of"), dict):
        return None
    of = body["of"]
    if of.get("name") != step_file.name or of.get("size") != st.st_size:
        return None
    if of.get("mtime_ns") != st.st_mtime_ns:
        try:  # the same bytes with a new time (a copied folder) still match; a rewrite does not
            if of.get("blake2b") != _digest(step_file):
                return None
        except OSError:
            return None
    if not isinstance(body.get("groups"), list) or not isinstance(body.get("trajectories"), list):
        return None
    return {"groups": body["groups"], "trajectories": body["trajectories"]}
