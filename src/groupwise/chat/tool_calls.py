"""Tool calls: render tools into the prompt, parse the model's tool-call text into OpenAI `tool_calls`.

Format. Hermes/Qwen: each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.
Templates that know tools (Qwen2.5, Hermes, Llama-3.1 ...) get the tools through
``apply_chat_template(tools=...)`` and render them their own way. A template without tool support
(SmolLM2's) gets the tools written into the system prompt in Hermes style, and past assistant
tool calls and tool results written as text, so the model sees one consistent format.

Parsing never raises: text whose tool-call blocks are not valid JSON objects with a string
``name`` (or nest deeper than `MAX_JSON_DEPTH`) comes back as plain content (the rollout can then
penalise it), never as a 500. `tool_call_blocks` and `read_tool_call` are the same reading, one call at
a time with what is wrong with it: an env that parses calls written as text (email's text mode) uses
them, so its agent is read as the server reads it.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = [
    "HERMES_TOOL_PROMPT",
    "MAX_JSON_DEPTH",
    "format_tool_call",
    "json_depth",
    "loads_model_json",
    "parse_tool_calls",
    "prepare_messages",
    "read_tool_call",
    "template_supports_tools",
    "tool_call_blocks",
]

HERMES_TOOL_PROMPT = (
    "You are a function calling AI model. You are provided with function signatures within "
    "<tools></tools> XML tags. You may call one or more functions to assist with the user query. "
    "Don't make assumptions about what values to plug into functions. Here are the available tools: "
    "<tools>\n{tools}\n</tools>\n"
    "For each function call return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags as follows:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"

# Deep enough for any tool call a schema asks for; a model's text nested deeper is a mistake to report,
# not a structure to walk (json's decoder raises RecursionError near 1000 levels, and code that walks
# the result recursively fails far sooner).
MAX_JSON_DEPTH = 32
_JSON_SPECIAL = re.compile(r'[\\"\[\]{}]')


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of JSON `text` nest (brackets inside strings do not count);
    an estimate for text that is not JSON (an unclosed string runs to the end), never an error. One pass
    over the quotes, backslashes and brackets: a regex that removed strings first started again at every
    quote of an unclosed string of escaped quotes, seconds of the GIL for 40,000 characters."""
    depth = deepest = 0
    in_string, escaped = False, -1
    for m in _JSON_SPECIAL.finditer(text):
        at, c = m.start(), m.group()
        if at == escaped:
            continue
        if in_string:
            if c == "\\":
                escaped = at + 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(0, depth - 1)
    return deepest


def loads_model_json(text: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` for JSON a model wrote: a `json.JSONDecodeError` also when it nests deeper than
    `max_depth`, so the reader can answer the model instead of failing on a RecursionError."""
    if json_depth(text) > max_depth:
        raise json.JSONDecodeError(f"nested deeper than {max_depth} levels", text, 0)
    return json.loads(text)


def template_supports_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "tools" in template


def format_tool_call(name: str, arguments: Any) -> str:
    """The Hermes text of one call (what a model without native tool support is taught to write)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _content_text(content: Any) -> str:
    # OpenAI allows content as a list of parts; we serve text models, so keep the text parts.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def prepare_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, tokenizer: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Messages (and tools) ready for ``tokenizer.apply_chat_template``.

    Returns (messages, tools_for_template): tools_for_template is None when the tools were
    rendered into the system prompt instead (template without tool support).
    """
    native = template_supports_tools(tokenizer)
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        msg: dict[str, Any] = {"role": "system" if role == "developer" else role}
        text = _content_text(m.get("content"))
        calls = m.get("tool_calls") or []
        if native:
            msg["content"] = text
            if calls:
                # HF templates take arguments as a dict; OpenAI sends a JSON string.
                msg["tool_calls"] = [
                    {"type": "function", "function": {"name": c["function"]["name"],
                                                      "arguments": _maybe_json(c["function"].get("arguments"))}}
                    for c in calls
                ]
            if role == "tool" and m.get("tool_call_id"):
                msg["tool_call_id"] = m["tool_call_id"]
        else:
            if calls:
                rendered = "\n".join(format_tool_call(c["function"]["name"], c["function"].get("arguments"))
                                     for c in calls)
                text = f"{text}\n{rendered}" if text else rendered
            if role == "tool":
                text = f"<tool_response>\n{text}\n</tool_response>"
            msg["content"] = text
        out.append(msg)
    if not tools:
        return out, None
    if native:
        return out, tools
    spec = "\n".join(json.dumps(t) for t in tools)
    prompt = HERMES_TOOL_PROMPT.format(tools=spec)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
    else:
        out.insert(0, {"role": "system", "content": prompt})
    return out, None


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _blocks(text: str) -> tuple[list[str], str]:
    """(each ``<tool_call>`` block's text, stripped; the text without the blocks, tags included). One pass
    with str.find: a regex (``<tool_call>\\s*(.*?)\\s*(?:</tool_call>|$)``) backtracked over every pair of
    positions of an unclosed block of whitespace, seconds of the GIL for a reply of 40,000 spaces."""
    blocks: list[str] = []
    rest: list[str] = []
    at = 0
    while (start := text.find(_OPEN, at)) != -1:
        rest.append(text[at:start])
        end = text.find(_CLOSE, start + len(_OPEN))
        if end == -1:  # an unclosed last block runs to the end
            blocks.append(text[start + len(_OPEN):].strip())
            return blocks, "".join(rest)
        blocks.append(text[start + len(_OPEN):end].strip())
        at = end + len(_CLOSE)
    rest.append(text[at:])
    return blocks, "".join(rest)


def tool_call_blocks(text: str) -> list[str]:
    """The JSON text of each ``<tool_call>`` block of `text`, in order; an unclosed last block counts
    (a reply cut by max_tokens right after its JSON)."""
    return _blocks(text)[0]


def read_tool_call(raw: str) -> tuple[str | None, Any, str | None]:
    """(name, arguments, None) of one call's JSON ``{"name": ..., "arguments": {...}}`` (ART's and
    some models' "parameters" too; arguments written as a JSON string are decoded), or (None, None,
    what is wrong with it, said to the model that wrote it)."""
    try:
        obj = loads_model_json(raw)
    except json.JSONDecodeError as exc:
        return None, None, (f"the tool call is not valid JSON ({exc.msg}); send "
                            '{"name": ..., "arguments": {...}}')
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, None, 'a tool call is a JSON object {"name": ..., "arguments": {...}} with the name a string'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = loads_model_json(args)
        except json.JSONDecodeError:
            pass  # kept as the text it is: the caller decides whether arguments must be an object
    return obj["name"], args, None


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]] | None]:
    """Split model text into (content, tool_calls). Malformed tool-call text -> (text, None)."""
    calls: list[dict[str, Any]] = []
    blocks, rest = _blocks(text)
    for raw in blocks:
        name, args, error = read_tool_call(raw)
        if error is not None:
            return text, None
        calls.append({
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        })
    if not calls:
        return text, None
    content = rest.strip()
    return (content or None), calls
