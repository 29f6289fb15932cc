"""The dashboard's rollout readers: steps, groups, trajectories, their tokens, and two steps side by side.

Trajectory files are read through `GroupCache`, keyed by each file's size and modification time: a
polling page re-reads a step only when the loop rewrote it, and a finished step is read once however
often it is shown. Every view but one trajectory's reads a step's index (`FileIndex`: per trajectory its
reward, advantage, metrics and previews; per group its scenario, prompt, exceptions and logs), built
from the summary the store writes beside each step file (`groupwise.runs.step_summary`): parsing the step
files themselves is dominated by every token's logprob entry, and a cold text search over a long run
would wait seconds for it. A run written before summaries existed (or a step file rewritten since its
summary) is indexed from the step file's rows, unvalidated (`groupwise.runs.view.read_group_dicts`), and a
background thread does that for every file while the app runs. One trajectory's view validates its
group only (`GroupCache.group`): the tokens it shows are read through `groupwise.core.trajectory`. The cache keeps
every file's small index and the stored rows of the few steps being looked at, so memory stays bounded
on a long run.

The token view says, per sampled token, what the loss saw: ``trained`` (a token the policy chose: the
loss weighs its logprob by the trajectory's advantage), ``forced`` (a grammar allowed only that token,
so it carries no decision of the policy and the trainer masks it) and ``masked`` (prompt, tool results
and any text that was not sampled: never in the loss). A trajectory of a group whose rewards were all
equal has no advantage (`group_advantages` returns None): its tokens trained nothing either.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from pathlib import Path
from typing import Any

from groupwise.core.choices import choice_forced_indices, choice_logprobs, choice_token_ids, choice_token_texts
from groupwise.errors import ConfigError, GroupwiseError, StoreError, UnknownKeyError
from groupwise.runs.view import RunView, read_group_dicts, read_summary, resolve_step
from groupwise.loop.detectors import judge_disagreement
from groupwise.runs.series import val_metric_name
from groupwise.runs.step_summary import content_text, message_dict, summarize, tool_calls
from groupwise.core.advantages import group_advantages
from groupwise.core.trajectory import Choice, TrajectoryGroup


class ParamError(UnknownKeyError):
    """A request's parameter names nothing stored (`status` 404) or nothing at all (400); the page shows
    the message, and the answer names `param`."""

    def __init__(self, message: str, *, param: str, status: int = 404) -> None:
        super().__init__(message)
        self.param, self.status = param, status


log = logging.getLogger("groupwise.dashboard")

# Parsed files kept whole (the views of one step); every file keeps only its light index (`FileIndex`).
ORDER = "best"  # the rollouts list's default order: best first
LIMIT = 50  # and how many it shows at once
KEEP_PARSED = 16


@dataclass
class FileIndex:
    """What searching and ranking across steps needs of one trajectory file, without its groups: a
    summary per trajectory (reward, advantage, metrics, preview) and its text in lower case, each
    group's scenario and prompt; and, computed once, the judge's agreement with the ground truth per
    metric."""

    rows: list[dict[str, Any]]
    texts: list[str]
    groups: list[dict[str, Any]] = field(default_factory=list)
    agreement: dict[str, float | None] = field(default_factory=dict)


class GroupCache:
    """Parsed trajectory files, re-read only when a file changed (size or mtime). The stored groups of
    the last `KEEP_PARSED` files opened in full are kept (a step being looked at); each file's
    `FileIndex` is kept for as long as the file is unchanged, so a search over every step re-reads
    nothing."""

    def __init__(self) -> None:
        # per file: its key, its groups as stored (unvalidated), and those validated so far by index
        self._files: OrderedDict[Path, tuple[tuple[int, int], list[dict[str, Any]], dict[int, TrajectoryGroup]]] = OrderedDict()
        self._index: dict[Path, tuple[tuple[int, int], FileIndex]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(path: Path) -> tuple[int, int]:
        try:
            st = path.stat()
        except OSError as exc:  # a link to nowhere, removed meanwhile
            raise _unreadable(path, exc) from None
        return (st.st_size, st.st_mtime_ns)

    def group(self, path: Path, index: int) -> TrajectoryGroup:
        """Group `index` of the file (its line among the groups `read_group_dicts` reads), validated:
        a trajectory's view validates its own group only (validating builds every token's logprob
        entry: a whole step would cost ten times as much)."""
        key = self._key(path)
        with self._lock:
            hit = self._files.get(path)
            if hit is not None and hit[0] == key:
                self._files.move_to_end(path)
        if hit is None or hit[0] != key:
            try:
                hit = (key, read_group_dicts(path, skip_corrupt=True, warn=False), {})
            except OSError as exc:
                raise _unreadable(path, exc) from None
            with self._lock:
                self._files[path] = hit
                self._files.move_to_end(path)
                while len(self._files) > KEEP_PARSED:
                    self._files.popitem(last=False)
        rows, parsed = hit[1], hit[2]
        if not 0 <= index < len(rows):
            raise UnknownKeyError(f"no group {index} in {path} ({len(rows)} groups)")
        if index not in parsed:
            try:
                parsed[index] = TrajectoryGroup.model_validate(rows[index])
            except ValueError as exc:  # pydantic's ValidationError: the line is not a sound group
                first = str(exc).strip().splitlines()
                raise StoreError(f"group {index} of {path} is not a valid TrajectoryGroup (the other groups of the "
                                 f"step still open; `groupwise inspect` reads the file with --skip-corrupt): "
                                 f"{'; '.join(first[:3])}") from None
        return parsed[index]

    def indexed(self, path: Path) -> bool:
        with self._lock:
            hit = self._index.get(path)
        return hit is not None and hit[0] == self._key(path)

    def index(self, path: Path, split: str, step: int, *, keep: bool = True) -> FileIndex:
        key = self._key(path)
        with self._lock:
            hit = self._index.get(path)
        if hit is not None and hit[0] == key:
            return hit[1]
        built = None
        summary = read_summary(path)
        if summary is not None:
            try:  # read_summary checked its shape: this is a second line of defence
                built = _file_index(summary, split, step)
            except (LookupError, TypeError, AttributeError, ValueError, OverflowError):
                built = None  # a summary damaged by hand: the step file is the record
        if built is None:  # a run written before summaries, or a step file rewritten since its summary
            try:
                built = _file_index(summarize(read_group_dicts(path, skip_corrupt=True, warn=False)), split, step)
            except OSError as exc:  # a folder where the step file should be, a file this user cannot read
                raise _unreadable(path, exc) from None
        with self._lock:
            self._index[path] = (key, built)
        return built


def _unreadable(path: Path, exc: OSError) -> StoreError:
    return StoreError(f"the step file {path} cannot be read ({exc.strerror or type(exc).__name__}); the views "
                      "of the other steps still open")


def _file_index(summary: dict[str, Any], split: str, step: int) -> FileIndex:
    """A step's `FileIndex` from its summary (`groupwise.runs.step_summary`), with each trajectory's advantage."""
    built = FileIndex([], [], groups=[{"scenario": g["scenario"], "prompt": g["prompt"], "exceptions": list(g["exceptions"]),
                                       "logs": list(g["logs"]), "metadata": dict(g["metadata"])} for g in summary["groups"]])
    by_group: dict[int, list[dict[str, Any]]] = {}
    for t in summary["trajectories"]:
        by_group.setdefault(int(t["group"]), []).append(t)
    for gi, trajs in sorted(by_group.items()):
        adv = group_advantages([float(t["reward"]) for t in trajs])
        for ti, t in enumerate(trajs):
            built.rows.append({"split": split, "step": step, "group": gi, "index": int(t["index"]),
                               "reward": float(t["reward"]), "advantage": None if adv is None else adv[ti],
                               "metrics": dict(t["metrics"]), "answer": str(t["answer"])})
            built.texts.append(str(t["text"]))  # lower case already
    return built


def index_in_background(cache: GroupCache, run_dirs: Callable[[], list[Path]], stop: threading.Event,
                        every_s: float = 2.0) -> None:
    """Index every trajectory file of every run, newest first, and each new one as it lands, until
    `stop`: the first search over a long run then finds the files parsed. Parsing is the dashboard's
    one heavy cost (minutes of CPU for 10,000 long trajectories); this thread runs at the lowest CPU
    priority (Linux), so a run training on the same machine keeps its cores."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except (AttributeError, OSError):
        pass  # not Linux: the thread runs at normal priority
    logged: set[Any] = set()  # what failed, logged once each (a damaged file fails on every pass)

    def failed(what: Any, exc: BaseException) -> None:
        if what not in logged:
            logged.add(what)
            log.warning("the dashboard could not index %s (%s: %s); its views read it when opened, and the "
                        "indexer goes on with the others", what, type(exc).__name__, exc)

    while not stop.is_set():
        try:
            runs = run_dirs()
        except Exception as exc:  # the thread lives as long as the app: nothing a folder holds may end it
            failed("the run folder", exc)
            runs = []
        for run_dir in runs:
            try:
                files = list(reversed(RunView(run_dir, watch=True).files()))
            except Exception as exc:
                failed(run_dir, exc)
                continue
            for split, step, path in files:
                if stop.is_set():
                    return
                try:
                    cache.index(path, split, step, keep=False)
                except (OSError, GroupwiseError):
                    continue  # replaced or removed meanwhile: the next pass reads it again
                except Exception as exc:  # a file no reader foresaw: logged, and the others are indexed
                    failed(path, exc)
        stop.wait(every_s)


def index_progress(cache: GroupCache, run_dir: Path) -> dict[str, int]:
    files = RunView(run_dir, watch=True).files()
    return {"files": len(files), "indexed": sum(1 for _, _, p in files if cache.indexed(p))}


def steps(run_dir: Path) -> dict[str, list[int]]:
    """{split: [stored steps]}."""
    out: dict[str, list[int]] = {}
    for split, step, _ in RunView(run_dir, watch=True).files():
        out.setdefault(split, []).append(step)
    return out


def _step_index(cache: GroupCache, run_dir: Path, split: str, step: int) -> FileIndex:
    files = RunView(run_dir, watch=True).files(split, step)
    return cache.index(files[0][2], split, step) if files else FileIndex([], [])


def scenario_key(index: int, group: TrajectoryGroup) -> Any:
    """What names a group's scenario across steps: its ``scenario_index`` metadata, else its position
    (as `groupwise compare` matches them)."""
    return group.metadata.get("scenario_index", index)


def _advantages(group: TrajectoryGroup) -> list[float | None]:
    adv = group_advantages([t.reward for t in group.trajectories])
    return list(adv) if adv is not None else [None] * len(group.trajectories)


def groups_view(cache: GroupCache, run_dir: Path, split: str, step: int) -> dict[str, Any]:
    """A step's groups, each with its trajectories ranked by reward (best first); from the step's index
    (its summary), so a step opens without parsing its tokens."""
    idx = _step_index(cache, run_dir, split, step)
    by_group: dict[int, list[dict[str, Any]]] = {gi: [] for gi in range(len(idx.groups))}
    for row in idx.rows:
        by_group.setdefault(row["group"], []).append(row)
    out = []
    for gi, g in enumerate(idx.groups):
        trajs = sorted(by_group[gi], key=lambda t: -t["reward"])
        rewards = [t["reward"] for t in trajs]
        out.append({"group": gi, "scenario": g["scenario"], "prompt": g["prompt"],
                    "mean_reward": sum(rewards) / len(rewards) if rewards else None,
                    "exceptions": g["exceptions"], "logs": g["logs"], "metadata": g["metadata"], "trajectories": trajs})
    return {"split": split, "step": step, "groups": out}


def rollouts(cache: GroupCache, run_dir: Path, *, split: str | None = None, step_min: int | None = None,
             step_max: int | None = None, reward_min: float | None = None, reward_max: float | None = None,
             text: str | None = None, order: str = ORDER, limit: int = LIMIT) -> dict[str, Any]:
    """Trajectories across steps that pass the filters, best (or worst) first."""
    needle = text.lower() if text else None
    found = []
    for s, step, path in RunView(run_dir, watch=True).files(split):
        if (step_min is not None and step < step_min) or (step_max is not None and step > step_max):
            continue
        try:
            idx = cache.index(path, s, step)
        except StoreError:  # an unreadable step: a search over the others still answers
            continue
        for row, body in zip(idx.rows, idx.texts):
            r = row["reward"]
            if (reward_min is not None and r < reward_min) or (reward_max is not None and r > reward_max):
                continue
            if needle and needle not in body:
                continue
            found.append(row)
    found.sort(key=lambda t: (t["reward"], -t["step"]), reverse=(order != "worst"))
    return {"total": len(found), "rollouts": found[:limit]}


def message(item: Any) -> dict[str, Any]:
    """A message or a sampled Choice (validated, or as stored: a dict with ``message`` and
    ``finish_reason``, the keys `groupwise.core.trajectory` tells a Choice by) as {role, content, tool_calls,
    sampled, ...} for the page."""
    if isinstance(item, Choice):
        return {"role": "assistant", "content": content_text(item.message.content), "sampled": True,
                "tool_calls": tool_calls(item.message.tool_calls), "finish_reason": item.finish_reason}
    return message_dict(item)


def tokens(item: Choice, advantage: float | None) -> list[dict[str, Any]] | None:
    """The sampled tokens of a Choice: text, id, logprob, and what the loss saw; None when the store
    has no token ids for it (a server that does not return them)."""
    ids = choice_token_ids(item)
    if ids is None:
        return None
    lps = choice_logprobs(item) or []
    texts = choice_token_texts(item) or []
    forced = set(choice_forced_indices(item))
    out = []
    for i, tid in enumerate(ids):
        text = texts[i] if i < len(texts) and not texts[i].startswith("token_id:") else None
        seen = "forced" if i in forced else "trained" if advantage is not None else "masked"
        out.append({"id": tid, "text": text, "logprob": lps[i] if i < len(lps) else None, "loss": seen})
    return out


def trajectory_view(cache: GroupCache, run_dir: Path, split: str, step: int, group: int, index: int) -> dict[str, Any]:
    """One trajectory in full: the conversation with tool calls, tokens, reward, metrics, logs (where the
    judge writes its explanation), side conversations."""
    files = RunView(run_dir, watch=True).files(split, step)
    if not files:
        raise ParamError(f"no {split!r} step {step} in {run_dir} (parameters split and step)", param="step")
    try:
        g = cache.group(files[0][2], group)
    except UnknownKeyError as exc:
        raise ParamError(f"{exc} (parameter group)", param="group") from None
    if not 0 <= index < len(g.trajectories):
        raise ParamError(f"no trajectory {index} in {split}/{step}/group {group} of {run_dir}, which has "
                         f"{len(g.trajectories)} (parameter index)", param="index")
    t = g.trajectories[index]
    adv = _advantages(g)[index]
    msgs = []
    for item in t.messages_and_choices:
        m = message(item)
        if isinstance(item, Choice):
            m["tokens"] = tokens(item, adv)
        msgs.append(m)
    return {"split": split, "step": step, "group": group, "index": index, "reward": t.reward, "advantage": adv,
            "metrics": dict(t.metrics), "metadata": dict(t.metadata), "logs": list(t.logs),
            "group_logs": list(g.logs), "scenario": scenario_key(group, g),
            "tools": [(x.get("function") or {}).get("name", "?") for x in t.tools or []],
            "policy_versions": [t.initial_policy_version, t.final_policy_version], "messages": msgs,
            "side": [[message(i) for i in h.messages_and_choices] for h in t.additional_histories]}


def compare_view(cache: GroupCache, run_dir: Path, history: list[dict[str, Any]], split: str, a: str, b: str) -> dict[str, Any]:
    """The same scenarios at two steps ('0', 'best', 'latest' or a number): each scenario's
    trajectories at both, ranked by reward."""
    stored = steps(run_dir).get(split, [])

    def resolve(spec: str, param: str) -> int:
        try:
            return resolve_step(spec, history, stored)
        except ConfigError as exc:
            if not stored:  # 'latest' or 'best' of a split with nothing stored: the split names nothing
                raise ParamError(f"no {split!r} trajectories are stored in {run_dir}; {param}={spec[:40]!r} names no "
                                 "step of it (parameter split)", param="split") from None
            raise ParamError(f"{'; '.join(exc.problems)} (parameter {param}, of split {split!r})", param=param,
                             status=400) from None

    step_a, step_b = resolve(a, "a"), resolve(b, "b")
    sides = []
    for step in (step_a, step_b):
        files = RunView(run_dir, watch=True).files(split, step)
        idx = cache.index(files[0][2], split, step) if files else FileIndex([], [])
        side: dict[Any, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        for gi, g in enumerate(idx.groups):
            side[g["scenario"]] = (g, sorted((r for r in idx.rows if r["group"] == gi), key=lambda x: -x["reward"]))
        sides.append(side)
    rows = []
    for key in [k for k in sides[0] if k in sides[1]]:
        rows.append({"scenario": key, "prompt": sides[0][key][0]["prompt"], "a": sides[0][key][1],
                     "b": sides[1][key][1]})
    return {"split": split, "a": step_a, "b": step_b, "scenarios": rows}


def judge_agreement(cache: GroupCache, run_dir: Path, history: list[dict[str, Any]]) -> dict[int, float]:
    """Per validation step, the share of rollout pairs the judge orders like the ground truth (the
    validation metric), where judged validation groups carry both (`judge_disagreement` computes it)."""
    metric = val_metric_name(history)
    out: dict[int, float] = {}
    if not metric:
        return out
    for split, step, path in RunView(run_dir, watch=True).files("val"):
        try:
            idx = cache.index(path, split, step)
        except StoreError:  # an unreadable step has no agreement to draw; the others do
            continue
        if metric not in idx.agreement:
            # the detector reads only each trajectory's reward and metrics: the index has them
            groups = [SimpleNamespace(trajectories=[SimpleNamespace(reward=r["reward"], metrics=r["metrics"])
                                                    for r in idx.rows if r["group"] == gi])
                      for gi in range(len(idx.groups))]
            judged = any("ruler_score" in t.metrics for g in groups for t in g.trajectories)
            # an agreement above 1 is impossible, so the detector always reports what it measured
            alert = judge_disagreement(groups, step=step, truth_key=metric, min_agreement=2.0, min_pairs=1) if judged else None
            idx.agreement[metric] = float(alert.evidence["agreement"]) if alert is not None else None
        if idx.agreement[metric] is not None:
            out[step] = idx.agreement[metric]
    return out
