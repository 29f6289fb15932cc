"""Response bodies of the OpenAI API from an engine's `GenerationResult` (server.py's handlers)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from groupwise.adapter_names import split_served_name
from groupwise.inference.engine import Completion, GenerationResult
from groupwise.chat.tool_calls import parse_tool_calls

__all__ = ["chat_response", "completion_response", "token_entries", "usage"]


def token_entries(tokenizer: Any, ids: list[int], logprobs: list[float], tops: list) -> list[dict]:
    """``logprobs.content`` of a chat choice: each sampled token, its logprob and alternatives."""
    texts = tokenizer.batch_decode([[i] for i in ids])
    out = []
    for j, (t, lp) in enumerate(zip(texts, logprobs)):
        top = []
        if tops:
            alt_texts = tokenizer.batch_decode([[i] for i, _ in tops[j]])
            top = [{"token": s, "logprob": v, "bytes": list(s.encode())} for s, (_, v) in zip(alt_texts, tops[j])]
        out.append({"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": top})
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


def chat_response(tokenizer: Any, result: GenerationResult, header: dict[str, Any], parse_tools: bool) -> dict:
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
            "logprobs": {"content": token_entries(tokenizer, c.token_ids, c.logprobs, c.top_logprobs)},
            "token_ids": c.token_ids,
            "forced_token_indices": c.forced_indices,
            **policy_versions(c),
        })
    return {**header, "object": "chat.completion", "choices": choices, "usage": usage(result)}


def completion_response(tokenizer: Any, result: GenerationResult, served_as: str) -> dict:
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
            "logprobs": {"tokens": texts, "token_logprobs": c.logprobs, "text_offset": offsets,
                         "top_logprobs": [
                             {tokenizer.decode([i]): v for i, v in top} for top in c.top_logprobs
                         ] if c.top_logprobs else None},
        })
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served_as, "system_fingerprint": served_as, "choices": choices, "usage": usage(result)}
