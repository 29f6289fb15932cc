"""Constrained decoding: `response_format` (json_schema, json_object), forced tool calls and vLLM's
`guided_choice` (one of a list of texts).

The grammar library is llguidance (guidance-ai, MIT). Checked with ``pip install --dry-run`` beside
torch 2.13.0 CPU on this machine:

- llguidance 1.9.1: one abi3 wheel, no dependencies, pure Rust core; computes a token bitmask on
  the CPU in tens of microseconds, JSON schema and Lark grammars (``%json`` inside Lark, which the
  tool-call grammar needs), special tokens by id. Chosen.
- xgrammar 0.2.8: would pull triton 3.9 and apache-tvm-ffi (a GPU toolchain on a CPU box), and
  ties its torch kernels to the torch build; rejected to keep the CPU install small and torch intact.
- outlines-core 0.2.14: installs cleanly, but builds a regex index over the whole vocabulary per
  schema (seconds for a 49k vocab), and has no grammar beyond regular languages.

Each constrained choice gets its own `llguidance.LLMatcher`; before sampling the engine asks every
matcher for the set of allowed next tokens (`allowed_mask`) and masks the sampling logits (the
reported logprobs stay raw, sampling.py); a token drawn where the mask allowed only it is reported as
forced (advance.py). When the grammar is complete only EOS is allowed, so the answer ends right after
the closing brace.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import torch

from groupwise.errors import GroupwiseError, MissingDependencyError

__all__ = ["NUMBER_BOUND", "Constraint", "ConstraintError", "allowed_mask", "bound_numbers", "constraint_for",
           "ll_tokenizer"]

# No free whitespace: a small model given the choice pads JSON with newlines until max_tokens.
# The separators are the ones models see most ({"a": 1, "b": 2}). lenient: unknown keywords
# (e.g. "format") are ignored instead of refusing the schema.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}

_TOKENIZERS: dict[int, Any] = {}
_TOKENIZERS_LOCK = threading.Lock()


class ConstraintError(GroupwiseError, ValueError):
    """A response_format or tool_choice cannot be turned into a grammar (the message says why)."""


def _llguidance():
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without the package
        raise MissingDependencyError("constrained decoding (response_format / tool_choice)", "backend",
                                     "llguidance") from exc
    return llguidance


def ll_tokenizer(tokenizer: Any) -> Any:
    """The llguidance view of a HF fast tokenizer, built once per tokenizer (~1 s)."""
    key = id(tokenizer)
    with _TOKENIZERS_LOCK:
        if key not in _TOKENIZERS:
            llg = _llguidance()
            _TOKENIZERS[key] = (tokenizer, llg.hf.from_tokenizer(tokenizer))
        return _TOKENIZERS[key][1]


class Constraint:
    """A compiled grammar; `new_matcher()` gives each choice its own parser state."""

    def __init__(self, grammar: str, tokenizer: Any, description: str, *,
                 json_schema: dict | None = None, lark: str | None = None):
        llg = _llguidance()
        self.grammar = grammar
        self.description = description
        # The source, for engines that compile grammars themselves (vllm_engine.py).
        self.json_schema, self.lark = json_schema, lark
        self._tok = ll_tokenizer(tokenizer)
        # Compiling the grammar and computing its first mask are where a hostile schema costs
        # seconds (llguidance builds the lexer's first states then); both happen here, where the
        # server builds constraints (off the event loop and off the compute thread, under a time
        # budget), and never again: every choice's matcher is a copy of this one, which shares its
        # compiled grammar and lexer states. Later masks are bounded by llguidance's per-step fuel.
        # log_level 0: llguidance prints none of its own messages (level 1 prints warnings); what went
        # wrong is read with get_error(): the schema's 400 here, the engine's log line when a step
        # runs out of fuel (advance.finish_reason)
        probe = llg.LLMatcher(self._tok, grammar, log_level=0, limits=_limits(llg))
        if not probe.is_error():
            probe.compute_bitmask()
        if probe.is_error():
            raise ConstraintError(f"{description}: the grammar does not compile: {probe.get_error()}")
        self._probe = probe

    def new_matcher(self) -> Any:
        """A fresh parser state for one choice (microseconds: a copy of the compiled probe)."""
        return self._probe.deep_copy()


def _limits(llg: Any) -> Any:
    """llguidance's resource limits, at its defaults (a mask step costs at most ~20 ms of lexer and
    parser work; past that the matcher errs and its row ends), with errors that do not echo the
    grammar or parser state back to the caller."""
    return llg.LLParserLimits(verbose_errors=False)


def allowed_mask(matchers: list[Any], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B, V] bool: True where the row's grammar allows the token (all True for unconstrained rows)."""
    out = np.ones((len(matchers), vocab_size), dtype=bool)
    for b, m in enumerate(matchers):
        if m is None:
            continue
        if m.is_error() or m.is_stopped():
            continue  # the engine finishes this row; leave it unmasked rather than all -inf
        words = np.frombuffer(m.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(words, bitorder="little").astype(bool)
        n = min(vocab_size, bits.shape[0])
        out[b, :n] = bits[:n]
        out[b, n:] = False  # padded vocabulary rows of the embedding are never valid text
    return torch.from_numpy(out).to(device)


# A number the schema leaves unbounded is bounded here: else a model (a small one especially) can
# write digits until max_tokens. 2**53 - 1 is the largest integer every JSON reader keeps exactly.
NUMBER_BOUND = 2**53 - 1
_SUBSCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _map_schemas(schema: Any, fn: Any) -> Any:
    """A copy of `schema` with `fn` (dict -> dict) applied to it and to every schema nested in it."""
    if not isinstance(schema, dict):
        return schema
    out = fn(dict(schema))
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _map_schemas(v, fn) for k, v in out[key].items()}
    for key in _SUBSCHEMA:
        if key in out:
            out[key] = _map_schemas(out[key], fn)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_map_schemas(v, fn) for v in out[key]]
    return out


def _bounded(out: dict[str, Any]) -> dict[str, Any]:
    types = out.get("type")
    types = types if isinstance(types, list) else [types]
    if "integer" in types or "number" in types:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -NUMBER_BOUND
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = NUMBER_BOUND
    return out


def bound_numbers(schema: Any) -> Any:
    """A copy of `schema` where every integer or number without a bound gets +-NUMBER_BOUND."""
    return _map_schemas(schema, _bounded)


def _closed(out: dict[str, Any]) -> dict[str, Any]:
    if out.get("type") == "object" and "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def _token_literal(tokenizer: Any, text: str) -> str:
    """Lark for `text`: a special token by id when the tokenizer has it as one token, else a string."""
    added = getattr(tokenizer, "get_added_vocab", lambda: {})()
    if text in added:
        return f"<[{added[text]}]>"
    return json.dumps(text)


# Keywords whose values are data, not schemas: a "$ref" key inside them is not a reference.
_DATA_KEYWORDS = ("const", "enum", "default", "examples")


def _rebase_refs(schema: Any, base: str) -> Any:
    """A copy of `schema` whose local references ("#", "#/$defs/Item", any "#/..." pointer) point into
    the document at `base` (a pointer such as "#/$defs/tool0") instead of at the root."""
    if isinstance(schema, list):
        return [_rebase_refs(v, base) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _rebase_refs(value, base)
    return out


def _tool_call_schema(tools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """The schema of one call of a tool: {"name": ..., "arguments": <its parameters>}. Each tool's
    parameters are a document of their own: pydantic writes nested models as "$defs" and "$ref":
    "#/$defs/Item", pointers from the parameters' root. Placed under "arguments" those would point at
    nothing, so each tool's parameters sit whole in the call schema's "$defs" and their references
    are rebased there."""
    options, documents = [], {}
    for t in tools:
        fn = t.get("function", t)
        if name is not None and fn.get("name") != name:
            continue
        # Undeclared arguments are useless to the tool, at any depth: an object that lists its properties
        # takes no others unless it says so (else a small model invents keys).
        params = _map_schemas(dict(fn.get("parameters") or {"type": "object"}), lambda s: _closed(_bounded(s)))
        key = f"tool{len(documents)}"
        documents[key] = _rebase_refs(params, f"#/$defs/{key}")
        options.append({
            "type": "object",
            "properties": {"name": {"const": fn["name"]}, "arguments": {"$ref": f"#/$defs/{key}"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    if not options:
        known = [t.get("function", t).get("name") for t in tools]
        raise ConstraintError(f"tool_choice names function {name!r}, which is not among the tools {known}")
    call = options[0] if len(options) == 1 else {"anyOf": options}
    return {**call, "$defs": documents}


def constraint_for(
    tokenizer: Any,
    *,
    response_format: dict[str, Any] | None = None,
    tools: list[dict[str, Any]] | None = None,
    tool_choice: Any = None,
    guided_choice: list[str] | None = None,
) -> Constraint | None:
    """The constraint an OpenAI request asks for, or None. Raises ConstraintError on a bad spec.

    llguidance is imported only when a request asks for a constraint, so plain requests never need it."""
    if guided_choice:
        # one of the texts, exactly, then only EOS; JSON string escapes are Lark's string escapes
        lark = "start: " + " | ".join(json.dumps(text) for text in guided_choice) + "\n"
        return Constraint(_llguidance().LLMatcher.grammar_from_lark(lark), tokenizer,
                          f"guided_choice of {len(guided_choice)}", lark=lark)
    forced_name: str | None = None
    force_tool = False
    if isinstance(tool_choice, dict):
        forced_name = (tool_choice.get("function") or {}).get("name")
        if not forced_name:
            raise ConstraintError("tool_choice object needs function.name")
        force_tool = True
    elif tool_choice == "required":
        force_tool = True
    elif tool_choice not in (None, "auto", "none"):
        raise ConstraintError(f"tool_choice={tool_choice!r}; use 'auto', 'none', 'required' or a named function")
    if force_tool:
        if not tools:
            raise ConstraintError("tool_choice forces a tool call but the request has no tools")
        schema = {**_tool_call_schema(tools, forced_name), "x-guidance": JSON_OPTIONS}
        lark = (
            f"start: {_token_literal(tokenizer, '<tool_call>')} \"\\n\" call \"\\n\" "
            f"{_token_literal(tokenizer, '</tool_call>')}\n"
            f"call: %json {json.dumps(schema)}\n"
        )
        return Constraint(_llguidance().LLMatcher.grammar_from_lark(lark), tokenizer,
                          f"tool_choice={tool_choice!r}", lark=lark)
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise ConstraintError("response_format.json_schema.schema must be a JSON schema object")
        schema = bound_numbers(schema)
    else:
        raise ConstraintError(f"response_format.type={kind!r}; use 'text', 'json_object' or 'json_schema'")
    llg = _llguidance()  # outside the try: a missing package is its own error, not a bad schema
    try:
        grammar = llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_OPTIONS)
    except Exception as exc:  # llguidance raises ValueError on schemas it cannot compile
        raise ConstraintError(f"response_format schema cannot be compiled: {exc}") from exc
    return Constraint(grammar, tokenizer, f"response_format={kind}", json_schema=schema)
