"""RULER: a relative LLM judge that scores a whole group of trajectories in one request.

How a call goes (`ruler_detailed`):

1. The group's messages are split into the common prefix (sent once) and per-trajectory remainders
   (prompt.py); long contents repeated across the shown remainders are written once and referenced
   (share_outputs). Trajectories the judge would see identically are shown once and share a score.
2. Order: the distinct trajectories are shuffled with `seed`; pass p of `passes` shows that order
   rotated by p*n/passes, so with passes <= n every trajectory sits at a different position in each
   pass (a balanced design against position bias). Ids are "1".."n" in the order shown and scores are
   mapped back by id, never by their position in the answer.
3. Groups with more than `max_group_size` distinct trajectories are judged in chunks. The first chunk
   is judged alone; its best, worst and middle trajectories become `anchors` shared by every other
   chunk (judged concurrently). A relative judge stretches each chunk over its own scale, so each
   chunk's scores are mapped onto the first chunk's scale by the least-squares line a*x+b through the
   anchors (offset only when the anchors got equal scores or the fit is inverted); anchors keep their
   first-chunk scores. Anchors that span the range keep the fit well conditioned.
4. Each request is retried on a bad answer (bad JSON, wrong ids or count, score out of [0,1]),
   timeout, connection error, 429 or 5xx, with exponential backoff, `retries` times; then `JudgeError`
   with the judge's last raw answer in `.raw`. Without a JSON-schema response format, a bad answer
   first gets one repair request (the judge sees its answer and the problems) before a fresh retry.
5. passes>1: scores are averaged over passes; `judge/pass_spearman` is the mean Spearman rank
   correlation between the passes' scores (1.0 = the order did not change the ranking).
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from groupwise.chat.text import LONE_SURROGATE
from groupwise.core.choices import choice_to_message
from groupwise.errors import ConfigError, GroupwiseWarning, JudgeError, JudgeUnreachableError
from groupwise.judge.cache import JudgeCache, request_key
from groupwise.judge.config import JudgeConfig, make_config
from groupwise.core.cost import Usage
from groupwise.judge.parse import BadAnswer, Score, parse_answer, repair_message
from groupwise.judge.prompt import (
    DEFAULT_RUBRIC,
    JudgeItem,
    last_assistant_preview,
    response_schema,
    split_prefix,
    system_message,
    user_message,
)
from groupwise.judge.providers import Endpoint, resolve
from groupwise.judge.reconcile import align, pass_orders, pick_anchors, spearman
from groupwise.core.trajectory import Choice, Trajectory, TrajectoryGroup
from groupwise.core.retry import retry

__all__ = ["JudgeStats", "RulerResult", "TrajectoryScore", "judge_stats", "ruler", "ruler_detailed", "ruler_score_group"]

DEFAULT_JUDGE_MODEL = "openai/o4-mini"  # ART's RULER default; any provider/model name works (judge/providers.py)


@dataclass
class TrajectoryScore:
    """The judge's verdict on one trajectory (index = its position in the input)."""

    index: int
    score: float
    explanation: str
    pass_scores: list[float] = field(default_factory=list)

    @property
    def trajectory_id(self) -> str:
        """ART's name: the 1-based position of the trajectory in the input, as a string."""
        return str(self.index + 1)


@dataclass
class RulerResult:
    scores: list[TrajectoryScore]  # input order
    usage: Usage
    metrics: dict[str, float | int]
    raw_answers: list[str]


@dataclass
class JudgeStats:
    """Process-wide counters. `dropped_groups` counts groups dropped by swallow_exceptions=True."""

    dropped_groups: int = 0
    last_errors: collections.deque = field(default_factory=lambda: collections.deque(maxlen=20))


judge_stats = JudgeStats()
"""Read `groupwise.judge.judge_stats.dropped_groups` to see how many groups the judge dropped."""


# ----------------------------------------------------------------------------- one request


async def _complete(endpoint: Endpoint, messages: list[dict[str, Any]], kwargs: dict[str, Any], timeout_s: float):
    resp = await endpoint.client.chat.completions.create(
        model=endpoint.model, messages=messages, timeout=timeout_s, **kwargs
    )
    content = resp.choices[0].message.content if resp.choices else None
    u = resp.usage
    return content, (u.prompt_tokens if u else 0), (u.completion_tokens if u else 0)


def _encodable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with each lone surrogate in their text as U+FFFD (groupwise.chat.text): the SDK
    encodes a request body as strict UTF-8, so one such character in a trajectory (or in a judge's
    answer sent back for repair) failed the whole request with UnicodeEncodeError, before any retry."""
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and LONE_SURROGATE.search(content):
            m = {**m, "content": LONE_SURROGATE.sub("\ufffd", content)}
        out.append(m)
    return out


def _retryable_status(code: int) -> bool:
    return code in (408, 409, 429) or code >= 500


class _Retryable(Exception):
    """A judge attempt failed in a way another attempt may not: timeout, connection, 408/409/429/5xx,
    or an answer that does not parse."""


class _Unreachable(_Retryable):
    """The endpoint could not be reached (no HTTP answer at all)."""


async def _request(
    endpoint: Endpoint,
    messages: list[dict[str, Any]],
    ids: list[str],
    cfg: JudgeConfig,
    usage: Usage,
    cache: JudgeCache | None,
    raw_answers: list[str],
) -> dict[str, Score]:
    """One judge request with retries (`groupwise.core.retry`: cfg.retries more attempts, backoff
    backoff_s * 2**i) and, without a JSON schema, one repair request per attempt."""
    import openai

    messages = _encodable(messages)
    fmt = endpoint.response_format if cfg.response_format == "auto" else cfg.response_format
    kwargs: dict[str, Any] = {}
    if fmt == "json_schema":
        kwargs["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": "ruler_scores",
                # A small local judge rambles until max_tokens; bound its explanations.
                "schema": response_schema(ids, max_explanation_chars=80 if endpoint.local else None),
                "strict": True,
            },
        }
    elif fmt == "json_object":
        kwargs["response_format"] = {"type": "json_object"}
    # Local judges decode greedily by default: the same request then gives the same answer.
    temperature = cfg.temperature if cfg.temperature is not None else (0.0 if endpoint.local else None)
    if temperature is not None:
        kwargs["temperature"] = temperature
    max_tokens = cfg.max_tokens or (96 * len(ids) + 32 if endpoint.local else None)
    if max_tokens is not None:
        # OpenAI's reasoning models accept only max_completion_tokens; other servers know max_tokens.
        kwargs["max_completion_tokens" if endpoint.label.startswith("openai/") else "max_tokens"] = max_tokens
    if cfg.extra_body:
        kwargs["extra_body"] = cfg.extra_body

    key = None
    if cache is not None:
        key = request_key({"base_url": endpoint.base_url, "model": endpoint.model, "messages": messages, **kwargs})
        hit = cache.get(key)
        if hit is not None:
            try:
                found = parse_answer(hit.get("content"), ids)
                usage.cache_hits += 1
                raw_answers.append(hit["content"])
                return found
            except BadAnswer:
                pass  # cannot happen for entries we wrote; treat a foreign entry as a miss

    last_raw: str | None = None

    async def ask(msgs: list[dict[str, Any]]) -> tuple[str | None, int, int]:
        # One judge request: its tokens are accounted and its answer kept for the error message.
        nonlocal last_raw
        try:
            content, pt, ct = await _complete(endpoint, _encodable(msgs), kwargs, cfg.timeout_s)
        except openai.APITimeoutError as e:
            raise _Retryable(f"timeout after {cfg.timeout_s} s") from e
        except openai.APIStatusError as e:
            last_raw = e.response.text if e.response is not None else str(e)
            if _retryable_status(e.status_code):
                raise _Retryable(f"HTTP {e.status_code} from the judge endpoint") from e
            if _context_exceeded(last_raw):  # the prompt is too long: no setting of the request changes that
                advice = (f"The request showed {len(ids)} trajectories, more than the judge's context holds: lower "
                          f"max_group_size (now {cfg.max_group_size}; a larger group is judged in chunks of that "
                          "many), shorten the trajectories, or use a judge with a longer context.")
            else:
                hint = ("; if the endpoint does not support JSON-schema output, pass response_format='json_object' "
                        "or 'none' (strict parsing with one repair request)."
                        if fmt == "json_schema" and e.status_code in (400, 422) else ".")
                advice = f"Check the model name, the API key and the request options{hint}"
            raise JudgeError(
                f"judge {endpoint.label} at {endpoint.base_url} refused the request with HTTP {e.status_code} "
                f"(not retried: a 4xx other than 408/409/429 will not change on retry): {last_raw[:500]}. {advice}",
                raw=last_raw,
            ) from e
        except openai.APIConnectionError as e:
            raise _Unreachable(f"cannot reach {endpoint.base_url} (chosen by {endpoint.source}): {e}") from e
        usage.add(pt, ct, endpoint.label, paid=endpoint.paid, prices=cfg.prices)
        last_raw = content
        return content, pt, ct

    def count_retry(_exc: BaseException, _attempt: int) -> None:
        usage.retries += 1

    @retry(max_attempts=cfg.retries + 1, delay=cfg.backoff_s, backoff_factor=2.0, exceptions=(_Retryable,),
           on_retry=count_retry)
    async def attempt() -> dict[str, Score]:
        content, pt, ct = await ask(messages)
        try:
            found = parse_answer(content, ids)
        except BadAnswer as bad:
            if fmt == "json_schema":
                raise _Retryable(f"bad answer: {bad}") from None
            fix = [*messages, {"role": "assistant", "content": content or ""}, repair_message(bad, ids)]
            content, pt, ct = await ask(fix)
            try:
                found = parse_answer(content, ids)
            except BadAnswer as bad2:
                raise _Retryable(f"bad answer after the repair request: {bad2}") from None
        raw_answers.append(content or "")
        if cache is not None and key is not None:
            cache.put(key, {"content": content, "usage": {"prompt_tokens": pt, "completion_tokens": ct}})
        return found

    try:
        return await attempt()
    except _Unreachable as last:
        raise JudgeUnreachableError(
            f"judge {endpoint.label} could not be reached in {cfg.retries + 1} attempts: {last}. Start that "
            "server, or point the judge at a running one: base_url= (ART: extra_litellm_params={'api_base': ...}) "
            "or the provider's variable (groupwise.judge.providers lists them).") from None
    except _Retryable as last:
        raise JudgeError(
            f"judge {endpoint.label} failed after {cfg.retries + 1} attempts; last problem: {last}. "
            "Raise retries=/timeout_s=, use a stronger judge, or pass swallow_exceptions=True to drop such groups "
            "(counted in groupwise.judge.judge_stats.dropped_groups). The last raw answer is in this error's .raw.",
            raw=last_raw,
        ) from None


def _context_exceeded(body: str | None) -> bool:
    """Whether an endpoint's error says the prompt is longer than the model's context (OpenAI's and
    groupwise's code ``context_length_exceeded``; vLLM's "maximum context length")."""
    text = (body or "").lower()
    return "context_length_exceeded" in text or "maximum context length" in text


# ----------------------------------------------------------------------------- orders, chunks, passes


async def _gather(coros: list[Any]) -> list[Any]:
    """Results in order; on the first failure the other requests are cancelled and it is raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        return [t.result() for t in tasks]
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class _Judge:
    """State of one `ruler_detailed` call: endpoint, prompt parts, usage, raw answers."""

    def __init__(self, endpoint: Endpoint, cfg: JudgeConfig, rubric: str | None, context, common_tools, items):
        self.endpoint, self.cfg = endpoint, cfg
        self.system = system_message(rubric)
        self.context, self.common_tools, self.items = context, common_tools, items
        self.usage = Usage()
        self.raw_answers: list[str] = []
        self.cache = JudgeCache(cfg.cache) if cfg.cache else None
        self.sem = asyncio.Semaphore(cfg.max_concurrent_requests)
        self.anchor_errors: list[float] = []
        self.chunks_per_pass = 1

    async def judge_shown(self, shown: list[int]) -> dict[int, Score]:
        ids = [str(k + 1) for k in range(len(shown))]
        user = user_message(
            self.context, self.common_tools, [(t, self.items[u]) for t, u in zip(ids, shown)],
            share_continuations=self.cfg.share_continuations,
            share_outputs=self.cfg.share_outputs,
            share_min_chars=self.cfg.share_min_chars,
        )
        async with self.sem:
            found = await _request(
                self.endpoint, [self.system, user], ids, self.cfg, self.usage, self.cache, self.raw_answers
            )
        return {u: found[t] for t, u in zip(ids, shown)}  # by id, never by answer position

    async def judge_order(self, order: list[int], pass_index: int) -> dict[int, Score]:
        m, k = self.cfg.max_group_size, self.cfg.anchors
        if len(order) <= m:
            return await self.judge_shown(order)
        first = await self.judge_shown(order[:m])
        anchors = pick_anchors(first, k)
        rest = order[m:]
        n_chunks = math.ceil(len(rest) / (m - len(anchors)))
        self.chunks_per_pass = 1 + n_chunks
        parts = [rest[c::n_chunks] for c in range(n_chunks)]
        shown_lists = []
        for c, part in enumerate(parts):
            shown = part + anchors
            random.Random(f"{self.cfg.seed}/{pass_index}/{c}").shuffle(shown)  # anchors not always last
            shown_lists.append(shown)
        results = await _gather([self.judge_shown(s) for s in shown_lists])
        out = dict(first)
        for part, res in zip(parts, results):
            a, b = align([res[u].score for u in anchors], [first[u].score for u in anchors])
            self.anchor_errors.extend(abs(a * res[u].score + b - first[u].score) for u in anchors)
            for u in part:
                out[u] = Score(score=min(1.0, max(0.0, a * res[u].score + b)), explanation=res[u].explanation)
        return out


def _as_messages(ms: Sequence[Any]) -> list[dict[str, Any]]:
    return [choice_to_message(m) if isinstance(m, Choice) else dict(m) for m in ms]


async def ruler_detailed(
    message_lists: Sequence[Sequence[Any]],
    judge_model: str,
    rubric: str | None = DEFAULT_RUBRIC,
    tools: Any = None,
    *,
    additional_histories: Sequence[Sequence[tuple[list, list | None]]] | None = None,
    config: JudgeConfig | None = None,
    client: Any = None,
    endpoint: Endpoint | None = None,
    **options: Any,
) -> RulerResult:
    """Like `ruler`, and also returns usage, metrics (judge/*) and the judge's raw answers."""
    if isinstance(rubric, dict):  # ART's third positional argument is extra_litellm_params
        options["extra_litellm_params"], rubric = rubric, options.pop("rubric", DEFAULT_RUBRIC)
    cfg = make_config(config, options)
    if not message_lists:
        raise ConfigError("message_lists is empty; there is nothing to judge", what="ruler() arguments")
    if endpoint is None:
        endpoint = resolve(judge_model, base_url=cfg.base_url, api_key=cfg.api_key, timeout_s=cfg.timeout_s, client=client)
    lists = [_as_messages(ms) for ms in message_lists]
    context, common_tools, items = split_prefix(lists, tools, additional_histories)
    unique: dict[str, int] = {}
    owner = [unique.setdefault(item.key(), len(unique)) for item in items]
    distinct: list[JudgeItem] = [None] * len(unique)  # type: ignore[list-item]
    for item, u in zip(items, owner):
        distinct[u] = item
    judge = _Judge(endpoint, cfg, rubric, context, common_tools, distinct)
    orders = pass_orders(len(distinct), cfg.passes, cfg.seed)
    passes = await _gather([judge.judge_order(o, p) for p, o in enumerate(orders)])
    scores = []
    for i, u in enumerate(owner):
        per_pass = [res[u].score for res in passes]
        explanation = passes[0][u].explanation
        if len(per_pass) > 1:
            explanation += "  [passes: " + ", ".join(f"{s:.2f}" for s in per_pass) + "]"
        scores.append(TrajectoryScore(index=i, score=sum(per_pass) / len(per_pass), explanation=explanation, pass_scores=per_pass))
    metrics: dict[str, float | int] = dict(judge.usage.metrics())
    metrics["judge/passes"] = cfg.passes
    metrics["judge/chunks"] = judge.chunks_per_pass
    if cfg.passes > 1 and len(distinct) > 1:
        rhos = [
            r
            for p in range(cfg.passes)
            for q in range(p + 1, cfg.passes)
            if (r := spearman([passes[p][u].score for u in range(len(distinct))], [passes[q][u].score for u in range(len(distinct))])) is not None
        ]
        if rhos:
            metrics["judge/pass_spearman"] = sum(rhos) / len(rhos)
    if judge.anchor_errors:
        metrics["judge/anchor_mae"] = sum(judge.anchor_errors) / len(judge.anchor_errors)
    return RulerResult(scores=scores, usage=judge.usage, metrics=metrics, raw_answers=judge.raw_answers)


async def ruler(
    message_lists: Sequence[Sequence[Any]],
    judge_model: str = DEFAULT_JUDGE_MODEL,
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str | None = DEFAULT_RUBRIC,
    tools: Any = None,
    *,
    debug: bool = False,
    **options: Any,
) -> list[TrajectoryScore]:
    """Score each message list relative to the others; one `TrajectoryScore` per input, in input order.

    The positional arguments are ART's, in ART's order (`extra_litellm_params`: ART's request settings,
    mapped by `make_config`). Options are `JudgeConfig` fields (passes, seed, max_group_size, retries,
    timeout_s, cache, ...), plus `additional_histories=`, `config=` and `client=` (an AsyncOpenAI to use as is).
    """
    if not message_lists:  # ART's answer to nothing to judge (ruler_detailed, with its metrics, refuses it)
        return []
    if extra_litellm_params is not None:
        options["extra_litellm_params"] = extra_litellm_params
    result = await ruler_detailed(message_lists, judge_model, rubric, tools, **options)
    if debug:
        print_debug(judge_model, [_as_messages(ms) for ms in message_lists], result)
    return result.scores


_warned_unreachable: set[str] = set()


def _warn_unreachable(message: str) -> None:
    """Say once per message (its URL and what chose it) that swallow_exceptions=True is dropping every
    group because the judge is unreachable: a run that trains on nothing must not look like one that
    trains on a flaky judge."""
    if message in _warned_unreachable:
        return
    _warned_unreachable.add(message)
    import warnings

    warnings.warn(GroupwiseWarning(f"RULER's judge is unreachable, so swallow_exceptions=True drops EVERY group it "
                                   f"judges (none are trained on): {message}"), stacklevel=3)


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str = DEFAULT_JUDGE_MODEL,
    extra_litellm_params: dict[str, Any] | None = None,
    rubric: str | None = DEFAULT_RUBRIC,
    *,
    swallow_exceptions: bool = False,
    debug: bool = False,
    **options: Any,
) -> TrajectoryGroup | None:
    """A new group whose rewards are the judge's relative scores (best ~1, worst ~0).

    Per trajectory: the old reward goes to ``metrics["independent_reward"]``, the score to `reward`
    and ``metrics["ruler_score"]``, the explanation to `logs` (``RULER explanation: ...``, as ART's). Group metadata, metrics (plus the
    judge/* metrics of this call), exceptions, logs and the trajectories' policy versions are kept.
    With swallow_exceptions=True every judge failure (an unknown provider, a missing API key, a
    refused or failed request, answers that never parse) returns None, as ART's does, and is counted
    in `groupwise.judge.judge_stats` (`dropped_groups`, `last_errors`); `gw.fit` also writes the
    step's count as ``reward/dropped_groups`` in its loop row. Invalid options always raise.
    """
    if group.pending:
        raise ConfigError(
            "ruler_score_group got a group whose rollouts have not run yet; await the group "
            "(or gather_trajectory_groups) first, then judge the finished group", what="ruler_score_group() arguments"
        )
    if not group.trajectories:
        return group.model_copy(deep=True)  # only exceptions: nothing to judge, keep the record
    if extra_litellm_params is not None:  # ART's third argument
        options["extra_litellm_params"] = extra_litellm_params
    client = options.pop("client", None)
    cfg = make_config(options.pop("config", None), options)
    trajs = group.trajectories
    lists = [t.messages() for t in trajs]
    histories = [[(h.messages(), h.tools) for h in t.additional_histories] for t in trajs]
    try:
        endpoint = resolve(judge_model, base_url=cfg.base_url, api_key=cfg.api_key, timeout_s=cfg.timeout_s,
                           client=client)
        result = await ruler_detailed(
            lists, judge_model, rubric, [t.tools for t in trajs], additional_histories=histories, config=cfg,
            endpoint=endpoint,
        )
    except Exception as e:
        if not swallow_exceptions:
            raise
        judge_stats.dropped_groups += 1
        judge_stats.last_errors.append(f"{type(e).__name__}: {e}")
        if isinstance(e, JudgeUnreachableError):  # not one bad answer: every group will go the same way
            _warn_unreachable(str(e))
        print(
            f"[ruler] group of {len(trajs)} dropped (swallow_exceptions=True; "
            f"{judge_stats.dropped_groups} dropped so far in groupwise.judge.judge_stats): {e}"
        )
        return None
    if debug or cfg.debug:
        print_debug(judge_model, lists, result)
    new_trajs: list[Trajectory] = []
    for t, s in zip(trajs, result.scores):
        new = t.model_copy(deep=True)
        new.metrics["independent_reward"] = t.reward
        new.metrics["ruler_score"] = s.score
        new.reward = s.score
        new.logs.append(f"RULER explanation: {s.explanation}")  # ART's line (the score is in metrics)
        new_trajs.append(new)
    return TrajectoryGroup(
        new_trajs,
        exceptions=[e.model_copy() for e in group.exceptions],
        metadata=dict(group.metadata),
        metrics={**group.metrics, **result.metrics},
        logs=list(group.logs),
    )



def format_debug(judge_model: str, message_lists: Sequence[Sequence[dict[str, Any]]], result: RulerResult) -> str:
    """The judge's verdicts, one block per trajectory in input order, best first marked."""
    u = result.usage
    head = (
        f"RULER {judge_model}: {len(result.scores)} trajectories, {u.requests} request(s)"
        f"{f' + {u.cache_hits} cached' if u.cache_hits else ''}, {u.prompt_tokens} prompt + "
        f"{u.completion_tokens} completion tokens, ${u.cost_usd:.4f}"
    )
    if "judge/pass_spearman" in result.metrics:
        head += f", pass rank correlation {result.metrics['judge/pass_spearman']:.2f}"
    best = max(s.score for s in result.scores)
    lines = [head]
    for s, ms in zip(result.scores, message_lists):
        mark = "*" if s.score == best else " "
        lines.append(f" {mark}#{s.index:<3} score {s.score:.2f}  last: {last_assistant_preview(ms)}")
        lines.append(f"        why: {' '.join(s.explanation.split()) or '(no explanation)'}")
    return "\n".join(lines)


def print_debug(judge_model: str, message_lists: Sequence[Sequence[dict[str, Any]]], result: RulerResult) -> None:
    print(format_debug(judge_model, message_lists, result), flush=True)
