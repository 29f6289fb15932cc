"""`convert_litellm_choice_to_openai` at ART's path (``art.utils.litellm``): a rollout that samples
through LiteLLM (`litellm.acompletion(model="hosted_vllm/<name>", base_url=model.inference_base_url)`)
appends the `openai` `Choice` this returns, as ART's email agent does.

Beyond ART's conversion (message, tool calls, logprobs), the sampled token ids that groupwise's server
returns with every choice are carried over: LiteLLM keeps a choice's fields it does not know in
`provider_specific_fields`, and without the ids the turn would be context only, never trained (the
tokens a text re-rendering gives are not always the tokens sampled). LiteLLM versions that drop that
field (1.65) keep the logprobs, whose tokens the server names by id (``"token_id:<id>"``, vLLM's
``return_tokens_as_token_ids``, on by default), so the ids survive there. LiteLLM itself is not imported:
the choice is read by its attributes, so this module costs nothing to import.
"""

from __future__ import annotations

from typing import Any

from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall, Function
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob

from groupwise.errors import GroupwiseError

__all__ = ["convert_litellm_choice_to_openai"]

# groupwise's server's extra fields of a choice (groupwise.core.choices.choice_token_ids reads them)
_CARRIED = ("token_ids", "forced_token_indices")


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def convert_litellm_choice_to_openai(litellm_choice: Any) -> Choice:
    """The `openai` `Choice` of a LiteLLM `Choices` (an assistant message, its function tool calls,
    its logprobs, and groupwise's sampled token ids)."""
    message = litellm_choice.message
    if message.role != "assistant":
        raise GroupwiseError(f"a LiteLLM choice with a {message.role!r} message; only assistant messages "
                             "are sampled choices")
    tool_calls = None
    if message.tool_calls:
        tool_calls = []
        for call in message.tool_calls:
            if call.type != "function" or call.function.name is None:
                raise GroupwiseError(f"a LiteLLM tool call of type {call.type!r} named {call.function.name!r}; "
                                     "only named function calls are supported")
            tool_calls.append(ChatCompletionMessageToolCall(
                id=call.id, type="function",
                function=Function(name=call.function.name, arguments=call.function.arguments)))
    logprobs = None
    if getattr(litellm_choice, "logprobs", None) is not None and litellm_choice.logprobs.content is not None:
        logprobs = ChoiceLogprobs(content=[
            ChatCompletionTokenLogprob(
                token=lp.token, bytes=lp.bytes, logprob=lp.logprob,
                top_logprobs=[TopLogprob(token=t.token, logprob=t.logprob, bytes=t.bytes)
                              for t in lp.top_logprobs or []])
            for lp in litellm_choice.logprobs.content])
    extra = getattr(litellm_choice, "provider_specific_fields", None) or {}
    carried = {name: extra[name] for name in _CARRIED if name in extra}
    for name in _CARRIED:  # a LiteLLM version that keeps unknown fields as attributes
        if name not in carried and _field(litellm_choice, name) is not None:
            carried[name] = _field(litellm_choice, name)
    return Choice(
        message=ChatCompletionMessage(content=message.content, role="assistant", tool_calls=tool_calls),
        finish_reason=litellm_choice.finish_reason, index=litellm_choice.index, logprobs=logprobs, **carried,
    )
