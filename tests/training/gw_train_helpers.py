"""Helpers of the training tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from openai.types.chat.chat_completion import ChatCompletionMessage, Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob


def make_choice(token_ids: list[int], logprobs: list[float] | None, text: str = "x") -> Choice:
    """A Choice as groupwise's server returns it: token ids in the extra field, logprobs per token."""
    lp = None
    if logprobs is not None:
        lp = ChoiceLogprobs(
            content=[
                ChatCompletionTokenLogprob(token=f"t{t}", logprob=l, bytes=None, top_logprobs=[])
                for t, l in zip(token_ids, logprobs)
            ]
        )
    return Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content=text),
        logprobs=lp,
        token_ids=list(token_ids),
    )
