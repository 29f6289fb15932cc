"""Response bodies of the OpenAI API from an engine's `GenerationResult` (server.py's handlers)."""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

from groupwise.core.adapter_names import split_served_name
from groupwise.inference.engine import Completion, GenerationResult
from groupwise.chat.tool_calls import parse_tool_calls
from groupwise.errors import NonFiniteError

__all__ = ["TokenTexts", "chat_response", "completion_response", "finite_logprobs", "token_entries", "usage"]


class TokenTexts:
    """Each vocabulary id's text as a token of its own (what ``tokenizer.batch_decode([[id]])`` gives),
    and the JSON of its logprob entry but for the logprob, each computed the first time the id is
    sampled. A chat choice names every sampled token in ``logprobs.content``; for a 128-token choice the
    tokenizer call, the 128 dicts and their JSON dump cost ~1.5 ms of the GIL per response, on the
    process whose compute thread steps the engine, where a rollout's requests are most of what holds
    the GIL (docs/benchmarks.md, several runs on one GPU). A token's single decode does not depend on
    its neighbours, so the cache gives the bytes the uncached path gave. It holds at most two entries per
    id of the vocabulary (one per naming of the token)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._text: dict[int, str] = {}
        self._entry: dict[tuple[int, bool], tuple[str, str]] = {}

    def texts(self, ids: list[int]) -> list[str]:
        missing = [i for i in dict.fromkeys(ids) if i not in self._text]
        if missing:
            self._text.update(zip(missing, self.tokenizer.batch_decode([[i] for i in missing])))
        return [self._text[i] for i in ids]

    def name(self, token_id: int, as_ids: bool) -> str:
        """The entry's ``token``: ``"token_id:<id>"`` with `as_ids` (vLLM's ``return_tokens_as_token_ids``),
        else its text."""
        return f"token_id:{token_id}" if as_ids else self.texts([token_id])[0]

    def content_json(self, ids: list[int], logprobs: list[float], as_ids: bool,
                     tops: list[list[tuple[int, float]]] | None = None) -> str:
        """``logprobs.content`` of a choice as JSON text, with its alternatives (`tops`) if any: each
        entry's fixed parts are dumped once per id and the logprobs put between, so a long choice with
        20 alternatives a token costs string joins, not a million dicts. A logprob that is not finite
        fails, as the JSON dump of the whole body did (``allow_nan=False``), and the server answers 500."""
        self.texts(ids)
        if tops:
            self.texts([i for top in tops for i, _ in top])
        parts = []
        for j, (tid, lp) in enumerate(zip(ids, logprobs)):
            alts = tops[j] if tops else ()
            if not math.isfinite(lp):
                finite_logprobs([tid], [lp])
            if not all(math.isfinite(v) for _, v in alts):
                finite_logprobs([i for i, _ in alts], [v for _, v in alts], what="alternative token")
            alt_json = ",".join(self._entry_json(alt, value, as_ids) + "}" for alt, value in alts)
            parts.append(self._entry_json(tid, lp, as_ids) + ',"top_logprobs":[' + alt_json + "]}")
        return "[" + ",".join(parts) + "]"

    def _entry_json(self, tid: int, logprob: float, as_ids: bool) -> str:
        """An entry's JSON up to its ``top_logprobs`` (not closed), for an id whose text is cached."""
        head, tail = self._parts(tid, as_ids)
        return head + float.__repr__(float(logprob)) + tail

    def _parts(self, tid: int, as_ids: bool) -> tuple[str, str]:
        """An entry's JSON before its logprob (``{"token":...,"logprob":``) and after it (``,"bytes":[...]``),
        for an id whose text is cached."""
        entry = self._entry.get((tid, as_ids))
        if entry is None:
            text = self._text[tid]
            token = f'"token_id:{tid}"' if as_ids else _dumps(text)
            entry = self._entry[(tid, as_ids)] = ('{"token":' + token + ',"logprob":',
                                                  ',"bytes":[' + ",".join(map(str, text.encode())) + "]")
        return entry


def _dumps(value: Any) -> str:
    """JSON as Starlette's `JSONResponse` writes it, so a body built in parts reads as one dumped whole."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def token_entries(texts: TokenTexts, ids: list[int], logprobs: list[float], tops: list, as_ids: bool) -> list[dict]:
    """``logprobs.content`` of a chat choice: each sampled token, its logprob and alternatives. With
    `as_ids` (vLLM's ``return_tokens_as_token_ids``) a token is named ``"token_id:<id>"``; its
    ``bytes`` stay its text's, so the text is still there for a reader that shows it."""
    out = []
    for j, (tid, t, lp) in enumerate(zip(ids, texts.texts(ids), logprobs)):
        top = []
        if tops:
            alts = [i for i, _ in tops[j]]
            top = [{"token": texts.name(i, as_ids), "logprob": v, "bytes": list(s.encode())}
                   for s, (i, v) in zip(texts.texts(alts), tops[j])]
        out.append({"token": texts.name(tid, as_ids), "logprob": lp, "bytes": list(t.encode()), "top_logprobs": top})
    return out


def policy_versions(c: Completion) -> dict[str, list[int]]:
    """``{"policy_versions": [step per token]}``: the step of the adapter that sampled each token (0: the
    base), which differs within a choice when a newer step was swapped in mid-sequence (partial
    rollouts). Empty when a token came from an adapter served under a name without a step (an alias)."""
    versions = []
    for adapter in c.adapters:
        step = "0" if adapter is None else split_served_name(adapter)[1]
        if not (step.isascii() and step.isdigit()):
            return {}
        versions.append(int(step))
    return {"policy_versions": versions} if len(versions) == len(c.token_ids) else {}


def usage(result: GenerationResult) -> dict[str, int]:
    completion_tokens = sum(len(c.token_ids) for c in result.completions)
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": result.prompt_tokens + completion_tokens}


def finite_logprobs(token_ids: list[int], logprobs: list[float], *, what: str = "sampled token") -> list[float]:
    """`logprobs`, or NonFiniteError naming the first that JSON cannot carry (the server answers 500)."""
    for tid, lp in zip(token_ids, logprobs):
        if not math.isfinite(lp):
            raise NonFiniteError(f"the engine reported logprob {lp!r} for {what} {tid}; JSON cannot "
                                 "carry it, so the response fails instead of sending invalid JSON")
    return logprobs


def chat_response(texts: TokenTexts, result: GenerationResult, header: dict[str, Any], parse_tools: bool,
                  tokens_as_ids: bool, compact: bool = False) -> bytes:
    """The body of a chat completion, as the UTF-8 JSON the client reads. A choice's logprob entries
    (and their alternatives) go in as `TokenTexts.content_json` made them (the rest is dumped as a
    whole): the same JSON a dump of the whole dict gives, at a fraction of the GIL. `compact` (a groupwise
    client's request that asked for no logprobs; groupwise.core.choices.TOKEN_DATA_HEADER): ``logprobs`` is
    null, and the sampled tokens' logprobs and texts are the lists ``token_logprobs`` and ``token_texts``."""
    choices = []
    for c in result.completions:
        content, calls = parse_tool_calls(c.text) if parse_tools else (c.text, None)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        choice = {
            "index": c.index,
            "message": message,
            "finish_reason": "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason,
            "token_ids": c.token_ids,
            "forced_token_indices": c.forced_indices,
            **policy_versions(c),
        }
        if compact and not c.top_logprobs:
            choice.update(logprobs=None, token_logprobs=finite_logprobs(c.token_ids, c.logprobs),
                          token_texts=texts.texts(c.token_ids))
            choices.append(_dumps(choice))
        else:  # a dumped dict ends in "}": the entries go in as its last field
            entries = texts.content_json(c.token_ids, c.logprobs, tokens_as_ids, c.top_logprobs)
            choices.append(_dumps(choice)[:-1] + ',"logprobs":{"content":' + entries + '}}')
    body = _dumps({**header, "object": "chat.completion", "usage": usage(result)})
    return (body[:-1] + ',"choices":[' + ",".join(choices) + "]}").encode()


def completion_response(texts: TokenTexts, result: GenerationResult, served_as: str, tokens_as_ids: bool,
                        prompt_ids: list[int] | None = None) -> bytes:
    """The body of a text completion, as UTF-8 JSON; dumped a choice at a time, so no single dump holds
    the GIL for the whole of a large answer (the server builds it on a worker thread). Each choice
    carries the prompt's token ids (``prompt_token_ids``, as vLLM names them): a completion has no
    messages to render, so a trajectory trains on the exact ids it was sampled from."""
    choices = []
    for c in result.completions:
        token_texts = texts.texts(c.token_ids)
        offsets, at = [], 0
        for t in token_texts:
            offsets.append(at)
            at += len(t)
        choices.append(_dumps({
            "index": c.index, "text": c.text, "finish_reason": c.finish_reason, "token_ids": c.token_ids,
            "forced_token_indices": c.forced_indices, **policy_versions(c),
            **({"prompt_token_ids": prompt_ids} if prompt_ids is not None else {}),
            "logprobs": {"tokens": [f"token_id:{i}" for i in c.token_ids] if tokens_as_ids else token_texts,
                         "token_logprobs": c.logprobs, "text_offset": offsets,
                         "top_logprobs": [
                             {texts.name(i, tokens_as_ids): v for i, v in top}
                             for top in c.top_logprobs
                         ] if c.top_logprobs else None},
        }))
    body = _dumps({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                   "model": served_as, "system_fingerprint": served_as, "usage": usage(result)})
    return (body[:-1] + ',"choices":[' + ",".join(choices) + "]}").encode()
