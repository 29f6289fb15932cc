"""The readers of files a person hands over or edits by hand: one per format, one shape of error.

A file a user writes (SFT demonstrations, a judge's labelled set, scenarios, a run's state) is read by
exactly one function here, and a line that is not what the format holds is ONE `RowError`: the file,
the line, what it holds and what the format expected, raised while the file is read, so before any
model loads. The CLI prints it as one line (exit code 1); no row, however odd, reaches a traceback.

What every reader does the same way (`parse_json`, `json_lines`):
- a UTF-8 byte-order mark at the start of the file is accepted (editors on Windows write one);
- lines end at ``\\n`` only (``str.splitlines`` also breaks at U+2028 and NEL, which JSON keeps raw
  inside strings), ``\\r\\n`` included; blank lines are skipped;
- bytes that are not UTF-8 are refused, naming the byte of the line;
- ``NaN``, ``Infinity`` and ``-Infinity`` (which Python's `json` accepts, though JSON has no such
  literals) and numbers past a float's range (``1e400`` reads as inf) are refused where the format holds
  numbers, with ``allow_nan`` for the store's own files that keep an inf logprob on purpose;
- nesting deeper than Python's parser recurses (a line of 100,000 ``[``) is refused, not a RecursionError;
- a row is checked against a pydantic model of the format (`read_rows`), whose first error names the
  field (``trajectories.0.label: Input should be a finite number``).

The client side reads with these and imports no torch.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictInt, StrictStr, ValidationError

from groupwise.errors import InvalidDataError

__all__ = ["RowError", "JSONProblem", "parse_json", "json_lines", "read_rows", "read_json_file", "describe",
           "FiniteNumber", "SFTRow", "SFT_ROW", "LabelledTrajectoryRow", "LabelledGroupRow", "PreferenceRow",
           "LABEL_ROW", "ScenarioRow", "MetricsState", "CheckpointStateFile", "read_sft_file", "kind_of", "validate"]

BOM = "\ufeff"


class RowError(InvalidDataError):
    """A line of a file a user handed over is not what its format holds: names the file, the line, what
    it holds and what the format expected (one line of text)."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str, expected: str):
        self.path, self.line, self.problem, self.expected = str(path), line, problem, expected
        super().__init__(f"{path}:{line}: {problem}; expected {expected}. Fix or remove that line")


class JSONProblem(InvalidDataError):
    """Text that is not strict JSON (`parse_json`); the message says why, without saying where."""


class _Refused(JSONProblem):
    """Raised by the parser's hooks (a NaN literal, a float past range) to leave `json.loads`."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} where a number is meant (JSON has no NaN or Infinity; write a finite number, or null)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text[:40]} is past a float's range")
    return value


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[:n] + "..."


def parse_json(text: str | bytes, *, allow_nan: bool = False) -> Any:
    """`json.loads`, strict: NaN/Infinity literals and numbers past a float are refused (unless
    `allow_nan`), and so is nesting Python cannot parse; all as a `JSONProblem`."""
    try:
        if allow_nan:
            return json.loads(text)
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise JSONProblem(f"not valid JSON: {exc.msg} (column {exc.colno})") from None
    except _Refused as exc:
        raise JSONProblem(str(exc)) from None
    except RecursionError:
        raise JSONProblem("JSON nested deeper than it can be read (thousands of levels)") from None
    except UnicodeDecodeError as exc:
        raise JSONProblem(f"not UTF-8 text (byte {exc.start})") from None


def _open(path: str | os.PathLike) -> Any:
    try:
        return open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise InvalidDataError(f"{path}: cannot be read ({exc.strerror}); pass a readable file") from None


def json_lines(path: str | os.PathLike, *, expected: str, allow_nan: bool = False) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSON-lines file, read as the caller goes (a
    file may be large); a line that is not strict JSON is a `RowError` saying `expected`."""
    with _open(path) as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RowError(path, n, f"not UTF-8 text (byte {exc.start} of the line)", expected) from None
            if n == 1:
                line = line.removeprefix(BOM)
            if not line.strip():
                continue
            try:
                yield n, parse_json(line, allow_nan=allow_nan)
            except JSONProblem as exc:
                raise RowError(path, n, str(exc), expected) from None


def kind_of(value: Any) -> str:
    """How a JSON value reads in an error: ``a JSON array``, ``the string 'x'``, ``the number 3``."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return f"an array of {len(value)}"
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, str):
        return f"the string {_short(value)!r}"
    return f"the number {_short(repr(value))}"


def describe(exc: ValidationError) -> str:
    """pydantic's first error as ``field.path: message`` (one line)."""
    err = exc.errors(include_url=False)[0]
    where = ".".join(str(x) for x in err["loc"]) or "the row"
    if err["type"] == "missing":
        return f"{where}: missing"
    if err["type"] == "value_error":  # our own validators say what they expected and what they got
        return f"{where}: {str(err['ctx']['error'])}"
    got = f" (got {kind_of(err['input'])})" if "input" in err else ""
    return f"{where}: {err['msg']}{got}"


Model = TypeVar("Model", bound=BaseModel)


def validate(model: type[Model], value: Any) -> Model:
    """`value` as `model`, or a `JSONProblem` saying what is wrong (a non-object row, a field)."""
    if not isinstance(value, dict):
        raise JSONProblem(f"the line holds {kind_of(value)}, not an object")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise JSONProblem(describe(exc)) from None
    except RecursionError:  # a value nested deep enough for pydantic's walk (json stops sooner, so rare)
        raise JSONProblem("a value nested deeper than it can be read") from None


def read_rows(path: str | os.PathLike, model: type[Model], *, expected: str) -> Iterator[tuple[int, Model]]:
    """(line number, row) of each line, each checked against `model`: any other line is a `RowError`."""
    for n, value in json_lines(path, expected=expected):
        try:
            yield n, validate(model, value)
        except JSONProblem as exc:
            raise RowError(path, n, str(exc), expected) from None


def read_json_file(path: str | os.PathLike, *, expected: str, allow_nan: bool = False) -> Any:
    """A whole file as one JSON value (BOM accepted); a `RowError` at line 1 when it is not JSON (a
    decode error names its own line)."""
    with _open(path) as f:
        data = f.read()
    try:
        text = data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        raise RowError(path, data.count(b"\n", 0, exc.start) + 1, f"not UTF-8 text (byte {exc.start})",
                       expected) from None
    try:
        return json.loads(text) if allow_nan else json.loads(text, parse_constant=_refuse_constant,
                                                               parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise RowError(path, exc.lineno, f"not valid JSON: {exc.msg} (column {exc.colno})", expected) from None
    except _Refused as exc:
        raise RowError(path, 1, str(exc), expected) from None
    except RecursionError:
        raise RowError(path, 1, "JSON nested deeper than it can be read", expected) from None


# ------------------------------------------------------------------------------------- the formats

# A number a format means: an int or a float, finite (bools and text are not numbers here: a label "0.8"
# read leniently hides a bug in whatever wrote the file).
def _finite_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a finite number, got {kind_of(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise ValueError("a finite number, got an integer past a float's range") from None
    if not math.isfinite(number):
        raise ValueError(f"a finite number, got {number}")
    return number


FiniteNumber = Annotated[float, PlainValidator(_finite_number)]


class _Row(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class ChatMessage(_Row):
    """A chat message: a role; the rest (content, tool calls) is checked by `groupwise.Trajectory`."""

    role: StrictStr


class SFTRow(_Row):
    """One demonstration of ART's SFT format."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None


SFT_ROW = '{"messages": [{"role": ..., "content": ...}, ...], "tools": [...] (optional)} (ART\'s SFT format)'


class LabelledTrajectoryRow(_Row):
    """One answer of a labelled group: the messages after the group's common prefix, or the answer text."""

    messages: list[ChatMessage] | None = None
    answer: StrictStr | None = None
    label: FiniteNumber

    def reply(self) -> list[dict[str, Any]]:
        if self.messages is not None:
            return [m.model_dump() for m in self.messages]
        return [{"role": "assistant", "content": self.answer or ""}]


class LabelledGroupRow(_Row):
    name: StrictStr | None = None
    messages: list[ChatMessage] = []
    trajectories: Annotated[list[LabelledTrajectoryRow], Field(min_length=2)]  # an order needs two


class PreferenceRow(_Row):
    name: StrictStr | None = None
    messages: list[ChatMessage] = []
    chosen: StrictStr | list[ChatMessage]
    rejected: StrictStr | list[ChatMessage]


LABEL_ROW = ('{"messages": [...], "trajectories": [{"answer": "..." or "messages": [...], "label": a finite '
             'number}, ...] (two or more)} or {"messages": [...], "chosen": ..., "rejected": ...}')


class ScenarioRow(_Row):
    """A scenario of `groupwise.mcp` (ART's GeneratedScenario)."""

    task: StrictStr
    difficulty: Annotated[StrictInt, Field(ge=1, le=5)]


class MetricsState(_Row):
    """What the run's state.json keeps of the step-metrics builder (`groupwise.core.metrics`)."""

    cum_state: dict[str, FiniteNumber] = {}
    unique_scenario_ids: list[StrictStr | StrictInt] = []


class CheckpointStateFile(_Row):
    """A checkpoint's state.json (training/checkpoint.py writes it last, as the completeness marker)."""

    step: Annotated[StrictInt, Field(ge=0)]
    cursor: dict[str, Any] = {}
    metrics: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    files: dict[str, Any] | list[str] = {}
    base: Any = None  # a dict (the weights digest); anything else reads as none


def read_sft_file(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, `Trajectory`) of each demonstration of an SFT file (ART's format), read as the caller
    goes; a line that is not one (a bad row, or messages `Trajectory` refuses) is a `RowError`."""
    from groupwise.core.trajectory import Trajectory

    for n, row in read_rows(path, SFTRow, expected=SFT_ROW):
        try:
            yield n, Trajectory(messages_and_choices=[m.model_dump() for m in row.messages], tools=row.tools)
        except ValidationError as exc:
            raise RowError(path, n, describe(exc), SFT_ROW) from None
        except (InvalidDataError, ValueError, TypeError) as exc:
            raise RowError(path, n, " ".join(str(exc).split()), SFT_ROW) from None
