"""ART's MCP types: a server's tools and resources, and the scenarios generated for them.

They are dataclasses, as ART's are, so ported code that builds them positionally, compares them or
calls `dataclasses.asdict` keeps working. `from_dict` also takes what the `mcp` SDK returns (an
`mcp.types.Tool` or `Resource`, or its dict with MCP's own key names ``inputSchema`` / ``mimeType``,
or the SDK 2.x's ``input_schema`` / ``mime_type``), so `await session.list_tools()` converts directly.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from groupwise.errors import ArgumentTypeError, ConfigError

__all__ = ["GeneratedScenario", "GeneratedScenarioCollection", "MCPResource", "MCPTool", "preview_line"]


def _as_dict(data: Any) -> dict[str, Any]:
    """A dict of `data`: a dict as is, an SDK pydantic object by its wire names (``inputSchema``)."""
    if isinstance(data, dict):
        return data
    if hasattr(data, "model_dump"):
        return data.model_dump(by_alias=True, exclude_none=True)
    raise ArgumentTypeError(f"expected a dict or an mcp SDK object, got {type(data).__name__}")


def _first(data: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if data.get(key) is not None:
            return data[key]
    return default


@dataclass
class MCPTool:
    """A tool an MCP server offers: its name, description and JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> "MCPTool":
        data = _as_dict(data)
        return cls(name=data.get("name", ""), description=data.get("description") or "",
                   parameters=_first(data, "parameters", "inputSchema", "input_schema", default={}))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def to_tool_schema(self) -> dict[str, Any]:
        """The tool as a chat completion request's ``tools`` entry."""
        return {"type": "function", "function": self.to_dict()}


@dataclass
class MCPResource:
    """A resource an MCP server exposes (a document, a listing) by URI."""

    uri: str
    name: str
    description: str
    mime_type: str | None = None

    @classmethod
    def from_dict(cls, data: Any) -> "MCPResource":
        data = _as_dict(data)
        return cls(uri=str(data.get("uri", "")), name=data.get("name", ""), description=data.get("description") or "",
                   mime_type=_first(data, "mimeType", "mime_type"))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"uri": self.uri, "name": self.name, "description": self.description}
        if self.mime_type:
            out["mimeType"] = self.mime_type  # MCP's own key name, as ART writes it
        return out


PREVIEW_CHARS = 120  # a previewed task is cut here, as ART's previews cut it


def _cut(task: str, max_length: int) -> str:
    return task if len(task) <= max_length else task[:max_length].strip() + "…"


def preview_line(number: int, task: str, difficulty: Any, max_length: int = PREVIEW_CHARS) -> str:
    """One line of a scenario preview, as ART prints it (a collection's `preview`, `preview_scenarios`)."""
    return f"   {number}. {_cut(task, max_length)}  (difficulty {difficulty}/5)"


@dataclass
class GeneratedScenario:
    """A task for an agent on an MCP server, with a difficulty from 1 (one call) to 5."""

    task: str
    difficulty: int

    def __post_init__(self) -> None:
        # ValueError, as ART raises: code that catches it keeps working
        if isinstance(self.difficulty, bool) or not isinstance(self.difficulty, int) or not 1 <= self.difficulty <= 5:
            raise ConfigError(f"difficulty must be an integer from 1 to 5, got {self.difficulty!r}",
                              what="GeneratedScenario")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GeneratedScenario":
        return cls(task=data["task"], difficulty=data["difficulty"])

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "difficulty": self.difficulty}

    def preview(self, max_length: int = PREVIEW_CHARS) -> str:
        """The task, cut to `max_length` characters with an ellipsis."""
        return _cut(self.task, max_length)


class GeneratedScenarioCollection:
    """Scenarios with the helpers ART's collection has: split, shuffle, filter, JSON round trip."""

    def __init__(self, scenarios: list[GeneratedScenario]) -> None:
        self.scenarios = scenarios

    @classmethod
    def from_dicts(cls, data: list[dict[str, Any]]) -> "GeneratedScenarioCollection":
        return cls([GeneratedScenario.from_dict(item) for item in data])

    @classmethod
    def from_json(cls, json_str: str) -> "GeneratedScenarioCollection":
        """From ``{"scenarios": [...]}``, a bare list, or an object whose first value is the list."""
        from groupwise.core.readers import JSONProblem, ScenarioRow, kind_of, parse_json, validate

        data = parse_json(json_str)  # strict JSON (groupwise.core.readers): a JSONProblem saying why otherwise
        if isinstance(data, dict):
            data = data["scenarios"] if "scenarios" in data else next(iter(data.values()), [])
        if not isinstance(data, list):
            raise JSONProblem(f'scenarios: expected {{"scenarios": [{{"task": ..., "difficulty": 1-5}}, ...]}} or a '
                              f"list of them, got {kind_of(data)}")
        rows = []
        for i, item in enumerate(data):
            try:
                rows.append(validate(ScenarioRow, item))
            except JSONProblem as exc:
                raise JSONProblem(f'scenario {i}: {exc}; expected {{"task": "...", "difficulty": 1-5}}') from None
        return cls.from_dicts([{"task": r.task, "difficulty": r.difficulty} for r in rows])

    def to_dicts(self) -> list[dict[str, Any]]:
        return [s.to_dict() for s in self.scenarios]

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps({"scenarios": self.to_dicts()}, indent=indent)

    def __len__(self) -> int:
        return len(self.scenarios)

    def __iter__(self) -> Iterator[GeneratedScenario]:
        return iter(self.scenarios)

    def __getitem__(self, index: Any) -> Any:
        return self.scenarios[index]

    def shuffle(self, seed: int | None = None) -> "GeneratedScenarioCollection":
        """A shuffled copy (`seed` makes it reproducible; ART's takes none and uses `random`'s state)."""
        shuffled = list(self.scenarios)
        (random.Random(seed) if seed is not None else random).shuffle(shuffled)
        return GeneratedScenarioCollection(shuffled)

    def split(self, train_size: int) -> tuple["GeneratedScenarioCollection", "GeneratedScenarioCollection"]:
        """The first `train_size` scenarios, and the rest."""
        if train_size > len(self.scenarios):
            raise ConfigError(f"train_size ({train_size}) is larger than the {len(self.scenarios)} scenarios",
                              what="train_size")
        return (GeneratedScenarioCollection(self.scenarios[:train_size]),
                GeneratedScenarioCollection(self.scenarios[train_size:]))

    def filter_by_difficulty(self, min_difficulty: int = 1, max_difficulty: int = 5) -> "GeneratedScenarioCollection":
        return GeneratedScenarioCollection(
            [s for s in self.scenarios if min_difficulty <= s.difficulty <= max_difficulty])

    def get_difficulty_distribution(self) -> Counter:
        return Counter(s.difficulty for s in self.scenarios)

    def preview(self, n: int = 5, max_task_length: int = PREVIEW_CHARS) -> None:
        """Print the first `n` tasks with their difficulty."""
        for i, s in enumerate(self.scenarios[:n]):
            print(preview_line(i + 1, s.task, s.difficulty, max_task_length))

    def print_difficulty_distribution(self) -> None:
        counts = self.get_difficulty_distribution()
        print("Difficulty distribution:")
        for d in range(1, 6):
            print(f"   {d}/5: {counts.get(d, 0):3d}  {'█' * min(counts.get(d, 0), 30)}")

    def get_summary(self) -> dict[str, Any]:
        n = len(self.scenarios)
        return {
            "total_scenarios": n,
            "difficulty_distribution": dict(self.get_difficulty_distribution()),
            "avg_difficulty": sum(s.difficulty for s in self.scenarios) / n if n else 0,
            "avg_task_length": sum(len(s.task) for s in self.scenarios) / n if n else 0,
        }
