"""Response bodies of the OpenAI API from an engine's `GenerationResult` (server.py's handlers)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from groupwise.adapter_names import split_served_name
from groupwise.inference.engine import Completion, GenerationResult
from groupwise.chat.tool_calls import parse_tool_calls

__all__ = ["chat_response", "completion_response", "token_entries", "usage"]


def token_entries(tokenizer: Any, ids: list[int], logprobs: list[float], tops: list, as_ids: bool) -> list[dict]:
    """``logprobs.content`` of a chat choice: each sampled token, its logprob and alternatives. With
    `as_ids` (vLLM's ``return_tokens_as_token_ids``) a token is named ``"token_id:<id>"``; its
    ``bytes`` stay its text's, so the text is still there for a reader that shows it."""
    texts = tokenizer.batch_decode([[i] for i in ids])

    def name(token_id: int, text: str) -> str:
        return f"token_id:{token_id}" if as_ids else text

    out = []
    for j, (tid, t, lp) in enumerate(zip(ids, texts, logprobs)):
        top = []
        if tops:
            alt_texts = tokenizer.batch_decode([[i] for i, _ in tops[j]])
            top = [{"token": name(i, s), "logprob": v, "bytes": list(s.encode())}
                   for s, (i, v) in zip(alt_texts, tops[j])]
        out.append({"token": name(tid, t), "logprob": lp, "bytes": list(t.encode()), "top_logprobs": top})
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


def chat_response(tokenizer: Any, result: GenerationResult, header: dict[str, Any], parse_tools: bool,
                  tokens_as_ids: bool) -> dict:
    choices = []
    for c in result.completions:
        content, calls = parse_tool_calls(c.text) if parse_tools else (c.text, None)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        choices.append({
            "index": c.index,
            "message": message,
            "finish_reason": "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason,
            "logprobs": {"content": token_entries(tokenizer, c.token_ids, c.logprobs, c.top_logprobs,
                                                        tokens_as_ids)},
            "token_ids": c.token_ids,
            "forced_token_indices": c.forced_indices,
            **policy_versions(c),
        })
    return {**header, "object": "chat.completion", "choices": choices, "usage": usage(result)}


def completion_response(tokenizer: Any, result: GenerationResult, served_as: str, tokens_as_ids: bool) -> dict:
    choices = []
    for c in result.completions:
        texts = tokenizer.batch_decode([[i] for i in c.token_ids])
        offsets, at = [], 0
        for t in texts:
            offsets.append(at)
            at += len(t)
        choices.append({
            "index": c.index, "text": c.text, "finish_reason": c.finish_reason, "token_ids": c.token_ids,
            "forced_token_indices": c.forced_indices, **policy_versions(c),
            "logprobs": {"tokens": [f"token_id:{i}" for i in c.token_ids] if tokens_as_ids else texts,
                         "token_logprobs": c.logprobs, "text_offset": offsets,
                         "top_logprobs": [
                             {(f"token_id:{i}" if tokens_as_ids else tokenizer.decode([i])): v for i, v in top}
                             for top in c.top_logprobs
                         ] if c.top_logprobs else None},
        })
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served_as, "system_fingerprint": served_as, "choices": choices, "usage": usage(result)}
