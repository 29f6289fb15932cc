"""Bounds on what one request may ask the server to build: tools, JSON schemas, regexes, model names.

Why. Validating a schema (jsonschema's meta-schema check, pure Python) and compiling it into a
grammar (llguidance) cost time that grows with the schema, and a small body can ask for a lot: 2000
tools, an ``anyOf`` of 3000 branches, or the 20-character pattern ``^(a{1000}){1000}$`` (a million
states once its repetitions are written out) each cost seconds to minutes. These bounds are checked
while the body is parsed, in one pass over the schema that stops at the first bound crossed, so a
hostile request is a 400 naming the bound before any of that work starts. The work that remains
runs off the event loop and off the compute thread, under a time budget (server.py, prepare.py).

The bounds are generous for honest use: OpenAI itself allows 128 tools per request, real tool
schemas have tens of nodes, and real patterns (dates, ids, enums of codes) expand to tens of
characters. docs/security.md lists them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEFAULT_MAX_BODY_BYTES", "MAX_MODEL_NAME_CHARS", "MAX_PATTERN_CHARS", "MAX_REGEX_SIZE", "MAX_SCHEMA_BRANCHES", "MAX_SCHEMA_DEPTH",
           "MAX_SCHEMA_NODES", "MAX_TOOLS", "SchemaBudget", "body_structure_problem", "regex_size"]

DEFAULT_MAX_BODY_BYTES = 8 * 2**20  # a full context of text with tools is well under 1 MiB
MAX_TOOLS = 128  # OpenAI's own limit per request
MAX_SCHEMA_NODES = 20_000  # JSON values in all of a request's schemas together (~1 s of validation)
MAX_SCHEMA_DEPTH = 32  # nesting of objects and arrays inside one schema
MAX_SCHEMA_BRANCHES = 256  # entries of one anyOf / oneOf / allOf / type list
MAX_PATTERN_CHARS = 1000  # characters of one regex (pattern, patternProperties key)
MAX_REGEX_SIZE = 10_000  # a regex's size with every counted repetition written out
MAX_MODEL_NAME_CHARS = 256

_BRANCHING = ("anyOf", "oneOf", "allOf", "prefixItems")


def body_structure_problem(raw: bytes, context_length: int) -> str | None:
    """Why `raw` has too many JSON objects, arrays or values to parse, or None.

    Parsing runs on the event loop, and what it costs is the Python objects it makes, not the bytes:
    8 MB of one string parse in milliseconds, 8 MB of 64,000 small tools in seconds (during which
    nobody is answered). So before parsing, the body's brackets and commas are counted (in C, a few
    milliseconds for 8 MB), inside strings too: counting only those outside strings costs as much as
    the parse. The bounds grow with the context: everything in a body but its response schema is
    rendered into the prompt, so an honest body has about as many brackets and commas as its prompt
    has tokens at most (a token-id prompt: one comma a token), plus its schemas' nodes."""
    containers, values = raw.count(b"{") + raw.count(b"["), raw.count(b",")
    max_containers = 2 * context_length + MAX_SCHEMA_NODES
    max_values = 4 * context_length + MAX_SCHEMA_NODES
    if containers > max_containers:
        return (f"the request body has {containers} '{{' and '[', more than {max_containers} (this server's bound on "
                "body structure: twice the context plus the schema nodes)")
    if values > max_values:
        return (f"the request body has {values} ',', more than {max_values} (this server's bound on body "
                "structure: four times the context plus the schema nodes)")
    return None


class SchemaBudget:
    """Counts the nodes of every schema of one request against MAX_SCHEMA_NODES (a request with
    128 tools of 200 nodes each is as costly as one schema of 25,600)."""

    def __init__(self) -> None:
        self.nodes = 0

    def check(self, schema: Any, what: str) -> None:
        """Raise ValueError naming the first bound `schema` crosses (`what` names it in the message)."""
        todo: list[tuple[Any, int, str]] = [(schema, 0, "")]
        while todo:
            value, depth, where = todo.pop()
            self.nodes += 1
            if self.nodes > MAX_SCHEMA_NODES:
                raise ValueError(f"{what}: the request's schemas have more than {MAX_SCHEMA_NODES} JSON values "
                                 "in all (this server's bound on schema size)")
            if depth > MAX_SCHEMA_DEPTH:
                raise ValueError(f"{what} nests deeper than {MAX_SCHEMA_DEPTH} levels at {where or '/'} (this "
                                 "server's bound on schema depth)")
            if isinstance(value, dict):
                for key, sub in value.items():
                    path = f"{where}/{key}"
                    if key in _BRANCHING or (key == "type" and isinstance(sub, list)):
                        if isinstance(sub, list) and len(sub) > MAX_SCHEMA_BRANCHES:
                            raise ValueError(f"{what}: {key} at {path} has {len(sub)} entries, more than "
                                             f"{MAX_SCHEMA_BRANCHES} (this server's bound on schema branches)")
                    if key == "pattern" and isinstance(sub, str):
                        _check_regex(sub, f"{what}: pattern at {path}")
                    if key == "patternProperties" and isinstance(sub, dict):
                        for regex in sub:
                            _check_regex(regex, f"{what}: patternProperties key at {path}")
                    todo.append((sub, depth + 1, path))
            elif isinstance(value, list):
                todo.extend((sub, depth + 1, f"{where}/{i}") for i, sub in enumerate(value))


def _check_regex(pattern: str, what: str) -> None:
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"{what} has {len(pattern)} characters, more than {MAX_PATTERN_CHARS} (this server's "
                         "bound on regex length)")
    size = regex_size(pattern)
    if size > MAX_REGEX_SIZE:
        raise ValueError(f"{what} {pattern[:60]!r} is {size} characters long with its repetitions written out, "
                         f"more than {MAX_REGEX_SIZE} (this server's bound on regex complexity)")


def regex_size(pattern: str) -> int:
    """The size of `pattern` with every counted repetition written out: ``a{3}`` is 3, ``(ab){2,5}``
    10, ``(a{1000}){1000}`` a million. An unbounded repetition (``*``, ``+``, ``{n,}``) counts its
    minimum plus one: a grammar engine loops over those instead of unrolling them.

    Measured on Python's own regex parser, which reads the JSON Schema (ECMA-262) patterns people
    write; one it cannot read is measured by multiplying all its counts, which overestimates."""
    import re

    try:
        from re import _parser as sre_parse  # Python >= 3.11
    except ImportError:  # pragma: no cover
        import sre_parse  # type: ignore[no-redef]
    try:
        return _size(sre_parse.parse(pattern), sre_parse)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError, IndexError):
        size = max(1, len(pattern))
        for low, comma, high in re.findall(r"\{(\d+)(,?)(\d*)\}", pattern):
            size *= max(int(high) if high else int(low) + len(comma), 1)
            if size > MAX_REGEX_SIZE:
                break
        return size


def _size(items: Any, sre: Any) -> int:
    total = 0
    for op, arg in items:
        name = str(op)
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            count = low + 1 if high == sre.MAXREPEAT else high
            total += max(count, 1) * _size(sub, sre)
        elif name == "SUBPATTERN":
            total += _size(arg[-1], sre)
        elif name == "BRANCH":
            total += sum(_size(b, sre) for b in arg[1])
        elif name in ("ASSERT", "ASSERT_NOT"):
            total += _size(arg[1], sre)
        elif name == "GROUPREF_EXISTS":
            total += sum(_size(b, sre) for b in arg[1:] if b is not None)
        else:
            total += 1
        if total > MAX_REGEX_SIZE:  # big enough to refuse: stop before the product overflows anything
            return total
    return total
