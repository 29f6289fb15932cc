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

A summary is also checked itself, since a reader trusts what it holds: one damaged in any way (cut
short, not JSON, binary bytes, a field of another type, groups and trajectories that do not fit each
other) or edited by hand is not used. Each summary names the digest of its own body (``body_blake2b``,
over the body as `_canonical` writes it), so a value changed by hand is found too; a summary written
before that field (version 1) is checked for its shape only.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from groupwise.core.trajectory import Trajectory

__all__ = ["PREVIEW_CHARS", "SUMMARY_VERSION", "answer_of", "answer_text", "content_text", "message_dict", "prompt_of", "read_summary", "summarize",
           "summary_of", "summary_path", "tool_calls"]

SUMMARY_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # version 1 has no digest of its own body: only its shape is checked
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
    for call in calls if isinstance(calls, (list, tuple)) else []:
        if not isinstance(call, dict):
            call = call.model_dump() if hasattr(call, "model_dump") else {}
        fn = call.get("function")
        fn = fn if isinstance(fn, dict) else {}
        out.append({"id": str(call.get("id", "")), "name": str(fn.get("name", "?")),
                    "arguments": str(fn.get("arguments", ""))})
    return out


def message_dict(item: dict[str, Any]) -> dict[str, Any]:
    """A stored message, or a stored Choice (a dict with ``message`` and ``finish_reason``, the keys
    `groupwise.core.trajectory` tells a Choice by), as {role, content, tool_calls, sampled, ...}."""
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


def answer_text(trajectory: "Trajectory") -> str:
    """The last assistant message's text, and its tool calls as ``name(arguments)`` ('' when there is none).

    A tool-calling agent often answers through a call (``return_final_answer``) with no text at all;
    without the calls every such answer read as '' and looked identical to the detectors.
    """
    for message in reversed(trajectory.messages()):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):  # content parts
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            calls = [c.get("function") or {} for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            return " ".join([content or "", *(f"{f.get('name', '')}({f.get('arguments', '')})" for f in calls)]).strip()
    return ""


def prompt_of(msgs: list[dict[str, Any]]) -> str:
    """The last user message's text on one line."""
    users = [m for m in msgs if m.get("role") == "user"]
    return " ".join(content_text(users[-1].get("content")).split()) if users else ""


def _reward(traj: dict[str, Any]) -> float:
    r = traj.get("reward", 0.0)
    try:
        return float(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else 0.0
    except OverflowError:  # an integer past float's range, in a step file damaged by hand
        return 0.0


def _list(v: Any) -> list[Any]:
    """A stored field that should be a list, as one (a hand-damaged step file may hold anything there)."""
    return v if isinstance(v, list) else []


def _metrics(v: Any) -> dict[str, Any]:
    """A trajectory's metrics as stored, the numbers only (what a `Trajectory` holds)."""
    return {str(k): x for k, x in v.items() if type(x) in (int, float, bool)} if isinstance(v, dict) else {}


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
        trajs = [t for t in _list(g.get("trajectories")) if isinstance(t, dict)]
        meta = g.get("metadata")
        first = [m for m in _list(trajs[0].get("messages_and_choices")) if isinstance(m, dict)] if trajs else []
        excs = [e for e in _list(g.get("exceptions")) if isinstance(e, dict)]
        logs = g.get("logs")
        scenario = meta.get("scenario_index", gi) if isinstance(meta, dict) else gi
        out_groups.append({"scenario": scenario if scenario is None or isinstance(scenario, (str, int, float, bool))
                           else str(scenario),
                           "prompt": prompt_of(first)[:PREVIEW_CHARS], "n": len(trajs),
                           "exceptions": [f"{e.get('type', '?')}: {e.get('message', '')}" for e in excs],
                           "logs": [str(x) for x in logs] if isinstance(logs, list) else [],
                           "metadata": dict(meta) if isinstance(meta, dict) else {}})
        for ti, t in enumerate(trajs):
            msgs = [message_dict(m) for m in _list(t.get("messages_and_choices")) if isinstance(m, dict)]
            logs = t.get("logs")
            out_trajs.append({"group": gi, "index": ti, "reward": _reward(t), "metrics": _metrics(t.get("metrics")),
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
    body = summarize(groups)
    return {"format": "groupwise.step-summary", "version": SUMMARY_VERSION,
            "of": {"name": step_file.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "blake2b": _digest(step_file)},
            "body_blake2b": _body_digest(body["groups"], body["trajectories"]), **body}


def _canonical(groups: list[Any], trajectories: list[Any]) -> bytes:
    """The summary's body as the bytes its digest covers: the same for the body as written and as read
    back (sorted keys, ASCII: a lone surrogate is escaped, as JSON reads it back)."""
    return json.dumps([groups, trajectories], sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _body_digest(groups: list[Any], trajectories: list[Any]) -> str:
    return hashlib.blake2b(_canonical(groups, trajectories), digest_size=16).hexdigest()


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _texts(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _sound(groups: list[Any], trajectories: list[Any]) -> bool:
    """Whether the body has the shape `summarize` builds: each group's fields of their types, and the
    trajectories those groups count, in order (group by group, each group's indices 0..n-1)."""
    for g in groups:
        if not (isinstance(g, dict) and _scalar(g.get("scenario", [])) and isinstance(g.get("prompt"), str)
                and type(g.get("n")) is int and g["n"] >= 0 and _texts(g.get("exceptions")) and _texts(g.get("logs"))
                and isinstance(g.get("metadata"), dict)):
            return False
    if len(trajectories) != sum(g["n"] for g in groups):
        return False
    at = iter([(gi, ti) for gi, g in enumerate(groups) for ti in range(g["n"])])
    for t in trajectories:
        if not isinstance(t, dict) or (t.get("group"), t.get("index")) != next(at):
            return False
        reward, metrics = t.get("reward"), t.get("metrics")
        if not (type(t["group"]) is int and type(t["index"]) is int and type(reward) in (int, float)
                and isinstance(metrics, dict)
                and all(type(v) in (int, float, bool) for v in metrics.values())
                and isinstance(t.get("answer"), str) and isinstance(t.get("text"), str)):
            return False
    return True


def read_summary(step_file: str | os.PathLike) -> dict[str, Any] | None:
    """The summary of `step_file` ({groups, trajectories} as `summarize` builds it), or None where there is
    none that describes the file as it is now (module doc: the caller then parses the step file)."""
    step_file = Path(step_file)
    try:
        with open(summary_path(step_file), encoding="utf-8") as f:
            body = json.load(f)
        st = step_file.stat()
    except (OSError, ValueError, RecursionError):
        return None  # none written (older code), or unreadable (cut short, not UTF-8, not JSON): the step file is the record
    if not isinstance(body, dict) or body.get("version") not in _READABLE_VERSIONS or not isinstance(body.get("of"), dict):
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
    groups, trajectories = body.get("groups"), body.get("trajectories")
    if not isinstance(groups, list) or not isinstance(trajectories, list) or not _sound(groups, trajectories):
        return None
    if body["version"] >= 2 and body.get("body_blake2b") != _body_digest(groups, trajectories):
        return None  # edited by hand, or its bytes damaged into other valid JSON
    return {"groups": groups, "trajectories": trajectories}
