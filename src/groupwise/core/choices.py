"""What groupwise's server adds to a `Choice`, and how to read it: the sampled token ids, their
logprobs and texts, the tokens a grammar forced, and the policy version of each token.

groupwise's own clients (`model.openai_client()`) send the header `TOKEN_DATA_HEADER`: a request of
theirs that does not ask for logprobs gets ``logprobs: null``, as from OpenAI, and the sampled tokens'
logprobs and texts as two plain lists, ``choice.token_logprobs`` and ``choice.token_texts``. The SDK
validates every field of every ``logprobs.content`` entry it parses (a pydantic model per token): for a
128-token choice that was half of a request's cost on the client, on the process that also steps the
engine (docs/benchmarks.md).
Any other client (LiteLLM, LangChain, a plain `openai` client) gets the entries, which carry the ids
through layers that drop unknown fields.
"""

from __future__ import annotations

import numbers
from typing import Any

from openai.types.chat.chat_completion import Choice

from groupwise.errors import InvalidDataError

__all__ = ["COMPACT_TOKEN_DATA", "TOKEN_DATA_HEADER", "choice_forced_indices", "choice_logprobs", "completion_tokens",
           "choice_policy_versions", "choice_to_message", "choice_token_ids", "choice_token_texts",
           "wants_compact_token_data"]

# A request header of groupwise's clients: with the value "compact", a choice's logprobs come as
# ``choice.token_logprobs`` (a list of numbers) unless the request asks for logprobs (module doc).
TOKEN_DATA_HEADER = "x-groupwise-token-data"
COMPACT_TOKEN_DATA = {TOKEN_DATA_HEADER: "compact"}  # the headers groupwise's clients send


def wants_compact_token_data(headers: Any) -> bool:
    """Whether request headers (or a client's default headers) ask for the compact form."""
    return headers.get(TOKEN_DATA_HEADER) == COMPACT_TOKEN_DATA[TOKEN_DATA_HEADER]


def choice_to_message(choice: Choice) -> dict[str, Any]:
    """The assistant message of a Choice, as a plain dict the `openai` SDK accepts back."""
    message = choice.message.model_dump(exclude_none=True, exclude_unset=False)
    # The SDK adds fields that are None or empty for plain chat; keep what a request needs.
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        out["tool_calls"] = message["tool_calls"]
    return out


def _choice_extra(choice: Choice, name: str) -> Any:
    """One of the extra fields groupwise's server adds to a choice (None when absent): an attribute, or
    kept in pydantic's `model_extra`."""
    value = getattr(choice, name, None)
    if value is None and choice.model_extra:
        value = choice.model_extra.get(name)
    return value


# The exact types a list of each kind usually holds (what JSON parsing gives): a list of only these is
# checked by its set of types, in C; anything else goes through the `numbers` ABCs' isinstance, which
# at ~1 us an element cost a step's tokenising most of its time (64 choices of 128 tokens).
_EXACT_TYPES = {numbers.Integral: frozenset({int}), numbers.Real: frozenset({int, float})}


def _checked_list(values: Any, kind: type, name: str, described: str) -> list[Any] | tuple[Any, ...]:
    """`values` (an extra field of a choice) if it is a list of `kind` (bools are not numbers here: a
    True among token ids is a bug, not id 1), else an error naming the field."""
    if isinstance(values, (list, tuple)) and (set(map(type, values)) <= _EXACT_TYPES[kind] or all(
            isinstance(v, kind) and not isinstance(v, bool) for v in values)):
        return values
    raise InvalidDataError(f"a Choice's {name} must be a list of {described}, got {str(values)[:80]}: the "
                           "server that sampled it returned something else, or the rollout edited them. "
                           "Append the Choice as the server returned it.")


def choice_token_ids(choice: Choice) -> list[int] | None:
    """The sampled token ids of a Choice, or None when the server did not return them.

    groupwise's server puts them in the extra field ``choice.token_ids``. vLLM's server, with
    ``return_tokens_as_token_ids``, writes each logprob entry's token as ``"token_id:123"``.
    """
    ids = _choice_extra(choice, "token_ids")
    if ids is not None:
        return list(map(int, _checked_list(ids, numbers.Integral, "token_ids", "ints")))
    content = choice.logprobs.content if choice.logprobs is not None else None
    if content and all(entry.token.startswith("token_id:") for entry in content):
        return [int(entry.token.split(":", 1)[1]) for entry in content]
    return None


def choice_prompt_token_ids(choice: Choice) -> list[int] | None:
    """The token ids of the prompt a text completion was sampled from (``choice.prompt_token_ids``, which
    groupwise's server and vLLM return on /v1/completions), or None: a chat choice's prompt is its
    conversation's messages, rendered by the chat template."""
    ids = _choice_extra(choice, "prompt_token_ids")
    return None if ids is None else list(map(int, _checked_list(ids, numbers.Integral, "prompt_token_ids", "ints")))


def choice_forced_indices(choice: Choice) -> list[int]:
    """Indices into `choice_token_ids` of the tokens a grammar forced (the only token it allowed, so
    no decision of the policy); empty when none or when the server did not say (it is groupwise's
    extra field ``choice.forced_token_indices``)."""
    idx = _choice_extra(choice, "forced_token_indices")
    return [int(i) for i in idx or []]


def choice_policy_versions(choice: Choice) -> list[int] | None:
    """The policy version (the training step of the adapter; 0 is the base) that sampled each token of
    a Choice, or None when the server did not say. groupwise's server puts it in the extra field
    ``choice.policy_versions``; its values differ within one choice when a newer step was swapped in
    while the choice was being sampled (partial rollouts of an asynchronous run)."""
    versions = _choice_extra(choice, "policy_versions")
    return None if versions is None else [int(v) for v in versions]


def choice_token_texts(choice: Choice) -> list[str] | None:
    """Each sampled token's own text (what a reader shows per token), or None when the server did not
    say: from ``logprobs.content`` (an entry named ``"token_id:<id>"`` keeps its text in its bytes) or
    from groupwise's extra field ``choice.token_texts`` (the compact form, module doc)."""
    content = choice.logprobs.content if choice.logprobs is not None else None
    if content:
        return [bytes(e.bytes).decode("utf-8", errors="replace") if e.token.startswith("token_id:") and e.bytes
                else e.token for e in content]
    texts = _choice_extra(choice, "token_texts")
    return None if texts is None else [str(t) for t in texts]


def choice_logprobs(choice: Choice) -> list[float] | None:
    """The logprob of each sampled token of a Choice, or None when absent: from ``logprobs.content``, or
    from groupwise's extra field ``choice.token_logprobs`` (the compact form, module doc)."""
    content = choice.logprobs.content if choice.logprobs is not None else None
    if content:
        return [float(entry.logprob) for entry in content]
    values = _choice_extra(choice, "token_logprobs")
    return None if values is None else list(map(float, _checked_list(values, numbers.Real, "token_logprobs",
                                                                       "numbers")))


def completion_tokens(messages_and_choices: list[Any]) -> float | None:
    """The mean number of tokens the choices among `messages_and_choices` sampled (from their token ids,
    else their logprobs), or None when none says: ART's ``completion_tokens`` trajectory metric, which
    its gather sets on every trajectory it collects."""
    counts = []
    for item in messages_and_choices:
        if isinstance(item, Choice):
            ids = choice_token_ids(item)
            lp = item.logprobs
            n = len(ids) if ids is not None else len(lp.content or lp.refusal or []) if lp is not None else 0
            if n:
                counts.append(n)
    return sum(counts) / len(counts) if counts else None
