"""OpenAI's Responses API and Anthropic's Messages API as chat completions, both ways.

The server answers ``POST /v1/responses`` and ``POST /v1/messages`` by translating each request into the
chat request ``POST /v1/chat/completions`` takes (messages, tools, tool_choice, sampling), running it on
the same path, and translating the chat answer back. One path means one rendering of the prompt: the
trainer renders a trajectory's chat messages with the same template, so the tokens it trains on are the
ones the engine sampled from, whichever API the agent spoke.

A rollout builds its trajectory from the same translation: `chat_messages` gives the chat messages of a
Responses or Messages request (the prompt), `choice_from_answer` the groupwise `Choice` of its answer
(with the sampled token ids and logprobs, which the server puts on the answer as on a chat choice:
``token_ids``, ``token_logprobs``, ``token_texts``, ``forced_token_indices``, ``policy_versions``)::

    answer = await client.responses.create(model=name, input=items, tools=tools)
    gw.Trajectory(messages_and_choices=[*chat_messages(request), choice_from_answer(answer)], reward=r)

Reasoning: the chat path has no reasoning field (the chat templates render ``content`` and
``tool_calls``), so Responses ``reasoning`` input items and Messages ``thinking`` / ``redacted_thinking``
blocks are dropped from the prompt, as a chat template drops what it does not render, and answers carry
no reasoning item: text a thinking template writes stays in the answer's text, which is what was sampled.

Plain dicts only (no torch, no SDK import): the request bodies as the server validated them
(groupwise.inference.api_models), and answers as the SDKs parse them (``model_dump()``) or as dicts.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from groupwise.errors import GroupwiseError, InvalidDataError

__all__ = ["ProtocolError", "chat_messages", "choice_from_answer", "messages_answer", "messages_events",
           "messages_to_chat", "responses_answer", "responses_events", "responses_to_chat", "TOKEN_FIELDS"]

# What the server adds to a chat choice and to a Responses / Messages answer alike (groupwise.core.choices)
TOKEN_FIELDS = ("token_ids", "token_logprobs", "token_texts", "forced_token_indices", "policy_versions")


class ProtocolError(GroupwiseError):
    """A request that has no chat equivalent; `param` names its field (the server answers 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


# ------------------------------------------------------------------------------------------- Responses


def _text_of_parts(content: Any, param: str) -> str:
    """The text of a Responses content (a string or a list of input_text / output_text / refusal parts)."""
    if isinstance(content, str):
        return content
    out = []
    for i, part in enumerate(content or []):
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            out.append(part.get("text", ""))
        elif kind == "refusal":
            out.append(part.get("refusal", ""))
        else:
            raise ProtocolError(f"{param}[{i}]: content parts of type {kind!r} are not supported: this server serves "
                                "text models (send input_text parts)", f"{param}[{i}].type")
    return "".join(out)


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request of a Responses request (a validated body, as a dict)."""
    if body.get("previous_response_id") is not None:
        raise ProtocolError("previous_response_id: this server stores no responses; send the whole conversation "
                            "in input (the Agents SDK does unless told to chain responses)", "previous_response_id")
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body["input"]
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for i, item in enumerate(items):
        kind = item.get("type") or "message"
        param = f"input[{i}]"
        if kind == "message":
            text = _text_of_parts(item.get("content"), f"{param}.content")
            role = item["role"]
            if role == "assistant" and messages and messages[-1]["role"] == "assistant" and messages[-1].get(
                    "tool_calls") is None:
                messages[-1]["content"] = (messages[-1]["content"] or "") + text
            else:
                messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments") or "{}"}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # the calls of one turn, after its text
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else _text_of_parts(output, f"{param}.output")})
        elif kind == "reasoning":
            continue  # no reasoning field on the chat path (module doc)
        else:
            raise ProtocolError(f"{param}: items of type {kind!r} are not supported here (send message, "
                                "function_call, function_call_output or reasoning items)", f"{param}.type")
    _check_tool_results(messages, "input")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("tools"):
        chat["tools"] = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters",
                                                                              "strict") if t.get(k) is not None}}
                         for t in body["tools"]]
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        chat["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format")
    if fmt and fmt["type"] != "text":
        chat["response_format"] = {"type": fmt["type"]} if fmt["type"] == "json_object" else {
            "type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "description", "strict")
                                                   if fmt.get(k) is not None}}
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("top_logprobs", "top_logprobs"), ("seed", "seed"), ("top_k", "top_k"),
                         ("stop", "stop")):
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    return chat


def _check_tool_results(messages: list[dict[str, Any]], param: str) -> None:
    """Each tool result answers a call made before it: a template renders an orphan result as if a call had
    been made, so the prompt would not say what the agent meant."""
    called = {c["id"] for m in messages for c in m.get("tool_calls") or []}
    for m in messages:
        if m["role"] == "tool" and m["tool_call_id"] not in called:
            raise ProtocolError(f"{param}: the tool result for call {m['tool_call_id']!r} answers no call in the "
                                "conversation; send the call before its result", param)


def _finish(chat_choice: dict[str, Any]) -> str:
    return chat_choice.get("finish_reason") or "stop"


def _token_data(chat_choice: dict[str, Any]) -> dict[str, Any]:
    return {k: chat_choice[k] for k in TOKEN_FIELDS if k in chat_choice}


def responses_answer(chat: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """The Responses object of a chat completion (`chat`: its body, one choice) for `request`."""
    choice = chat["choices"][0]
    message = choice["message"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": message["content"], "annotations": [],
                                    "logprobs": []}]})
    for call in message.get("tool_calls") or []:
        output.append({"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call["id"],
                       "name": call["function"]["name"], "arguments": call["function"]["arguments"],
                       "status": "completed"})
    usage = chat.get("usage") or {}
    truncated = _finish(choice) == "length"
    return {
        "id": f"resp_{uuid.uuid4().hex}", "object": "response", "created_at": chat.get("created", int(time.time())),
        "status": "incomplete" if truncated else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "instructions": request.get("instructions"), "max_output_tokens": request.get("max_output_tokens"),
        "model": chat["model"], "output": output, "parallel_tool_calls": True,
        "temperature": request.get("temperature"), "top_p": request.get("top_p"),
        "tool_choice": request.get("tool_choice") or "auto", "tools": request.get("tools") or [],
        "text": request.get("text") or {"format": {"type": "text"}}, "truncation": "disabled",
        "metadata": request.get("metadata") or {}, "reasoning": None,
        "usage": {"input_tokens": usage.get("prompt_tokens", 0), "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": usage.get("completion_tokens", 0), "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage.get("total_tokens", 0)},
        "finish_reason": _finish(choice), **_token_data(choice),
    }


def responses_events(answer: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of a Responses stream that ends with `answer`: (event name, data) pairs in
    the order OpenAI sends them, each output item announced, its text or arguments as one delta, done."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, "sequence_number": len(events), **data}))

    pending = {**answer, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    for index, item in enumerate(answer["output"]):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            emit("response.output_item.added", output_index=index, item={**item, "status": "in_progress", "content": []})
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            emit("response.content_part.added", output_index=index, item_id=item["id"], content_index=0, part=part)
            emit("response.output_text.delta", output_index=index, item_id=item["id"], content_index=0, delta=text,
                 logprobs=[])
            emit("response.output_text.done", output_index=index, item_id=item["id"], content_index=0, text=text,
                 logprobs=[])
            emit("response.content_part.done", output_index=index, item_id=item["id"], content_index=0,
                 part=item["content"][0])
        else:
            emit("response.output_item.added", output_index=index,
                 item={**item, "status": "in_progress", "arguments": ""})
            emit("response.function_call_arguments.delta", output_index=index, item_id=item["id"],
                 delta=item["arguments"])
            emit("response.function_call_arguments.done", output_index=index, item_id=item["id"],
                 name=item["name"], arguments=item["arguments"])
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.incomplete" if answer["status"] == "incomplete" else "response.completed", response=answer)
    return events


# ------------------------------------------------------------------------------------------- Messages


def _block_text(content: Any, param: str, kinds: tuple[str, ...] = ("text",)) -> str:
    if isinstance(content, str):
        return content
    out = []
    for i, block in enumerate(content or []):
        if block.get("type") in kinds:
            out.append(block.get("text", ""))
        else:
            raise ProtocolError(f"{param}[{i}]: blocks of type {block.get('type')!r} are not supported here: this "
                                "server serves text models (send text blocks)", f"{param}[{i}].type")
    return "".join(out)


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request of an Anthropic Messages request (a validated body, as a dict).

    A user turn's tool_result blocks become tool messages (in order, before the turn's text, as the
    Messages API requires them first); an assistant turn's text blocks its content and its tool_use
    blocks its tool calls (``input`` as JSON text)."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": _block_text(system, "system")})
    for i, turn in enumerate(body["messages"]):
        param = f"messages[{i}].content"
        content = turn["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        texts, calls = [], []
        for j, block in enumerate(blocks):
            kind = block["type"]
            if kind == "text":
                texts.append(block["text"])
            elif kind in ("thinking", "redacted_thinking"):
                continue  # no reasoning field on the chat path (module doc)
            elif kind == "tool_use" and turn["role"] == "assistant":
                calls.append({"id": block["id"], "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
            elif kind == "tool_result" and turn["role"] == "user":
                result = block.get("content")
                text = _block_text(result, f"{param}[{j}].content") if result is not None else ""
                messages.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                                 "content": f"Error: {text}" if block.get("is_error") else text})
            else:
                raise ProtocolError(f"{param}[{j}]: a {turn['role']} turn cannot hold a {kind!r} block (tool_use "
                                    "is the assistant's, tool_result the user's; images are not supported)",
                                    f"{param}[{j}].type")
        if turn["role"] == "assistant":
            messages.append({"role": "assistant", "content": "".join(texts) or None, **({"tool_calls": calls}
                                                                                       if calls else {})})
        elif texts or isinstance(content, str):
            messages.append({"role": "user", "content": "".join(texts)})
    _check_tool_results(messages, "messages")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages, "max_tokens": body["max_tokens"]}
    if body.get("tools"):
        chat["tools"] = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"],
                                                           **({"description": t["description"]}
                                                              if t.get("description") else {})}}
                         for t in body["tools"]]
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}.get(choice["type"]) or {
            "type": "function", "function": {"name": choice.get("name")}}
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                         ("stop", "stop_sequences")):
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    return chat


_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def messages_answer(chat: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic Message of a chat completion (`chat`: its body, one choice)."""
    choice = chat["choices"][0]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"] or "{}")
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": arguments if isinstance(arguments, dict) else {"value": arguments}})
    usage = chat.get("usage") or {}
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": chat["model"],
            "content": content, "stop_reason": _STOP_REASONS.get(_finish(choice), "end_turn"), "stop_sequence": None,
            "usage": {"input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0)},
            "finish_reason": _finish(choice), **_token_data(choice)}


def messages_events(answer: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The server-sent events of a Messages stream that ends with `answer`, in Anthropic's order. The
    token data rides on ``message_start``'s message: the SDK builds its final message from that one."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, **data}))

    emit("message_start", message={**answer, "content": [], "stop_reason": None,
                                   "usage": {**answer["usage"], "output_tokens": 0}})
    for index, block in enumerate(answer["content"]):
        if block["type"] == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            emit("content_block_delta", index=index, delta={"type": "text_delta", "text": block["text"]})
        else:
            emit("content_block_start", index=index, content_block={**block, "input": {}})
            emit("content_block_delta", index=index,
                 delta={"type": "input_json_delta", "partial_json": json.dumps(block["input"])})
        emit("content_block_stop", index=index)
    emit("message_delta", delta={"stop_reason": answer["stop_reason"], "stop_sequence": None},
         usage={"output_tokens": answer["usage"]["output_tokens"]})
    emit("message_stop")
    return events


# ------------------------------------------------------------------------------------------- trajectories


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=False)
    raise InvalidDataError(f"expected a request body or an answer (a dict or an SDK object), got {type(value).__name__}")


def chat_messages(request: Any) -> list[dict[str, Any]]:
    """The chat messages of a Responses or Messages request body (the prompt a trajectory holds): Responses
    when it has ``input``, Messages when it has ``messages`` and ``max_tokens``. Pass the tools as the
    trajectory's tools in chat form: ``responses_to_chat(body)["tools"]`` (or messages_to_chat's)."""
    body = _as_dict(request)
    if "input" in body:
        return responses_to_chat({"model": "", **body})["messages"]
    if "messages" in body:
        return messages_to_chat({"model": "", "max_tokens": 1, **body})["messages"]
    raise InvalidDataError("a request body of the Responses API has 'input'; of the Messages API, 'messages'")


def choice_from_answer(answer: Any) -> Any:
    """The groupwise `Choice` (openai's chat Choice, with the sampled token ids and logprobs) of a Responses
    or Messages answer from groupwise's server, for ``Trajectory(messages_and_choices=[..., choice])``."""
    from openai.types.chat.chat_completion import Choice

    body = _as_dict(answer)
    extra = {**(body.get("model_extra") or {}), **body}
    if extra.get("token_ids") is None:
        raise InvalidDataError("this answer carries no token_ids: it did not come from groupwise's server (or a "
                               "layer dropped the field); a trajectory needs the sampled tokens")
    content, calls = None, []
    if body.get("object") == "response":
        texts = []
        for item in body["output"]:
            if item["type"] == "message":
                texts.extend(p.get("text") or p.get("refusal") or "" for p in item["content"])
            elif item["type"] == "function_call":
                calls.append({"id": item["call_id"], "type": "function",
                              "function": {"name": item["name"], "arguments": item["arguments"]}})
        content = "".join(texts) or None
    elif body.get("type") == "message":
        texts = [b["text"] for b in body["content"] if b["type"] == "text"]
        calls = [{"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
                 for b in body["content"] if b["type"] == "tool_use"]
        content = "".join(texts) or None
    else:
        raise InvalidDataError("not an answer of the Responses API (object 'response') or of the Messages API "
                               "(type 'message')")
    choice = {"index": 0, "finish_reason": extra.get("finish_reason") or ("tool_calls" if calls else "stop"),
              "logprobs": None, "message": {"role": "assistant", "content": content,
                                            **({"tool_calls": calls} if calls else {})},
              **{k: extra[k] for k in TOKEN_FIELDS if extra.get(k) is not None}}
    return Choice.model_validate(choice)
