"""`groupwise inspect RUN_DIR`: read stored trajectories like a transcript ("watch your rollouts").

    groupwise inspect .groupwise/2048/models/agent-001 --split val --worst -n 2

For each selected split (default: every split) it reads one step (default: the latest), prints a
one-line summary (groups, trajectories, exceptions, mean reward) and then `n` trajectories: reward,
metrics, metadata, policy versions, every message with its role (coloured when stdout is a
terminal and NO_COLOR is unset), tool calls with their arguments, tool results, sampled-token
counts and mean logprob of each Choice, side conversations (additional_histories), logs (where
the RULER judge writes its explanation) and the group's recorded exceptions.

`format_trajectory` and `format_exception` are reused by other commands (compare).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from groupwise.core.choices import choice_logprobs, choice_token_ids
from groupwise.runs.step_summary import content_text
from groupwise.runs.view import RunView, read_groups
from groupwise.core.trajectory import Choice, History, PydanticException, Trajectory, TrajectoryGroup

__all__ = ["format_trajectory", "format_exception", "content_text", "Palette"]

# Long contents (a 4k-token system prompt) would bury the dialogue: show the head and the tail.
MAX_CHARS = 3000


class Palette:
    """ANSI styles, or nothing when colour is off."""

    ROLE_CODES = {"system": "2", "developer": "2", "user": "36", "assistant": "32", "tool": "33", "function": "33"}

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.enabled and text else text

    def role(self, role: str, text: str) -> str:
        return self._wrap("1;" + self.ROLE_CODES.get(role, "0"), text)

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def red(self, text: str) -> str:
        return self._wrap("31", text)

    def magenta(self, text: str) -> str:
        return self._wrap("35", text)


def _use_colour(stream: Any) -> bool:
    return hasattr(stream, "isatty") and stream.isatty() and not os.environ.get("NO_COLOR")


def _clip(text: str) -> str:
    if len(text) <= MAX_CHARS:
        return text
    half = MAX_CHARS // 2
    return f"{text[:half]}\n  … ({len(text) - 2 * half} characters not shown) …\n{text[-half:]}"


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines()) if text else prefix.rstrip()


def _tool_call_line(call: Any, p: Palette) -> str:
    if not isinstance(call, dict):
        call = call.model_dump() if hasattr(call, "model_dump") else {"function": {"name": str(call)}}
    fn = call.get("function") or {}
    args = fn.get("arguments", "")
    try:  # compact JSON when it parses; shown raw (it is what the model wrote) when it does not
        args = json.dumps(json.loads(args), ensure_ascii=False)
    except (TypeError, ValueError):
        pass
    return p.magenta(f"→ {fn.get('name', '?')}({args})") + p.dim(f"  [{call.get('id', '')}]")


def _format_item(item: Any, p: Palette, indent: str) -> str:
    if isinstance(item, Choice):
        msg = item.message
        role = "assistant"
        text = content_text(msg.content)
        calls = list(msg.tool_calls or [])
        ids, lps = choice_token_ids(item), choice_logprobs(item)
        notes = [f"finish={item.finish_reason}"]
        if ids is not None:
            notes.append(_plural(len(ids), "token"))
        if lps:
            notes.append(f"mean logprob {sum(lps) / len(lps):.3f}")
        header = p.role(role, f"{role}") + p.dim("  (sampled; " + ", ".join(notes) + ")")
    else:
        role = str(item.get("role", "?"))
        text = content_text(item.get("content"))
        calls = list(item.get("tool_calls") or [])
        extra = f"  (result of {item['tool_call_id']})" if role == "tool" and item.get("tool_call_id") else ""
        if item.get("name"):
            extra += f"  name={item['name']}"
        header = p.role(role, role) + p.dim(extra)
    lines = [indent + header]
    if text:
        lines.append(_indent(_clip(text), indent + "  "))
    for call in calls:
        lines.append(indent + "  " + _tool_call_line(call, p))
    return "\n".join(lines)


def _fmt_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_exception(exc: PydanticException, p: Palette | None = None, *, full: bool = False) -> str:
    p = p or Palette(False)
    head = p.red(f"{exc.type}: {exc.message}")
    if full:
        return head + "\n" + _indent(exc.traceback.rstrip(), "    ")
    # The last frame says where it happened; the full traceback is in the store file.
    frames = [line.strip() for line in exc.traceback.splitlines() if line.strip().startswith("File ")]
    return head + (p.dim(f"\n    at {frames[-1]}") if frames else "")


def format_trajectory(traj: Trajectory, p: Palette | None = None, *, title: str = "") -> str:
    """A readable transcript of one trajectory (see the module docstring for what it shows)."""
    p = p or Palette(False)
    out = [p.bold(f"{title}reward {traj.reward:.4g}")]
    if traj.initial_policy_version is not None or traj.final_policy_version is not None:
        out[0] += p.dim(f"   policy v{traj.initial_policy_version} → v{traj.final_policy_version}")
    if traj.metrics:
        out.append("  metrics:  " + ", ".join(f"{k}={_fmt_value(v)}" for k, v in traj.metrics.items()))
    if traj.metadata:
        out.append("  metadata: " + ", ".join(f"{k}={_fmt_value(v)}" for k, v in traj.metadata.items()))
    if traj.tools:
        names = [(t.get("function") or {}).get("name", "?") for t in traj.tools]
        out.append("  tools:    " + ", ".join(names))
    for item in traj.messages_and_choices:
        out.append(_format_item(item, p, "  "))
    for n, hist in enumerate(traj.additional_histories):
        out.append(p.dim(f"  ┌ side conversation {n + 1} of {len(traj.additional_histories)}"))
        out.append(_format_history(hist, p))
    if traj.logs:
        out.append(p.bold("  logs:"))
        out.extend(_indent(line, "    ") for line in traj.logs)
    return "\n".join(out)


def _format_history(hist: History, p: Palette) -> str:
    return "\n".join(_format_item(item, p, "  │ ") for item in hist.messages_and_choices)


def _group_summary(groups: list[TrajectoryGroup]) -> str:
    rewards = [t.reward for g in groups for t in g.trajectories]
    n_exc = sum(len(g.exceptions) for g in groups)
    mean = f"{sum(rewards) / len(rewards):.4g}" if rewards else "n/a"
    return (f"{_plural(len(groups), 'group')}, {_plural(len(rewards), 'trajectory', 'trajectories')}, "
            f"{_plural(n_exc, 'exception')}, mean reward {mean}")


def _plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def inspect_run(run_dir: str | Path, *, split: str | None, step: int | None, order: str, n: int, out: Any = None,
                skip_corrupt: bool = False) -> int:
    """Print trajectories of a run; the body of `groupwise inspect`. Returns the exit code."""
    out = out or sys.stdout
    p = Palette(_use_colour(out))
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        print(f"groupwise inspect: {run_dir} does not exist (expected <base_path>/<project>/models/<model>, "
              f"e.g. .groupwise/2048/models/agent-001)", file=sys.stderr)
        return 2
    files = RunView(run_dir).files(split)
    if not files:
        what = f"split {split!r}" if split else "any split"
        print(f"groupwise inspect: no trajectories for {what} under {run_dir / 'trajectories'}", file=sys.stderr)
        return 1
    by_split: dict[str, list[tuple[int, Path]]] = {}
    for s, st, path in files:
        by_split.setdefault(s, []).append((st, path))
    shown_any = False
    for s, entries in by_split.items():
        steps = [st for st, _ in entries]
        chosen = [(st, path) for st, path in entries if st == (step if step is not None else max(steps))]
        if not chosen:
            print(p.dim(f"{s}: no step {step} (steps stored: {steps[0]}…{steps[-1]})"), file=out)
            continue
        st, path = chosen[0]
        groups = read_groups(path, skip_corrupt=skip_corrupt)  # a skipped line is named in a warning
        shown_any = True
        others = f"steps stored: {steps[0]}…{steps[-1]} ({len(steps)})" if len(steps) > 1 else "the only step"
        print(p.bold(f"━━ {s} · step {st} ━━ ") + p.dim(f"{others} · {path}"), file=out)
        print("   " + _group_summary(groups), file=out)
        items = [(gi, ti, t) for gi, g in enumerate(groups) for ti, t in enumerate(g.trajectories)]
        if order == "best":
            items.sort(key=lambda x: -x[2].reward)
        elif order == "worst":
            items.sort(key=lambda x: x[2].reward)
        for gi, ti, traj in items[:n]:
            group = groups[gi]
            title = f"group {gi} · trajectory {ti} of {len(group.trajectories)} · "
            print("", file=out)
            print(format_trajectory(traj, p, title=title), file=out)
        excs = [(gi, e) for gi, g in enumerate(groups) for e in g.exceptions]
        if excs:
            print("", file=out)
            print(p.red(f"   {len(excs)} recorded exception(s):"), file=out)
            for gi, e in excs[:n]:
                print(f"   group {gi}: " + format_exception(e, p), file=out)
        for gi, g in enumerate(groups):
            if g.logs:
                print(p.dim(f"   group {gi} logs: ") + " | ".join(g.logs), file=out)
        print("", file=out)
    return 0 if shown_any else 1
