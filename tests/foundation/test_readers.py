"""Every file a user hands over is read by one reader per format (groupwise/core/readers.py), and any line
that is not what the format holds is ONE error naming the file and line, never another exception:
hypothesis feeds each reader arbitrary bytes and arbitrary JSON values per line; the samples the issue
names (arrays, strings, numbers, 100k-deep nesting, labels that are text, null, NaN or missing, NaN and
inf numbers, a byte-order mark) are checked by name."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from groupwise.errors import CorruptRecordError, GroupwiseWarning, InvalidDataError
from groupwise.runs.history import RunHistory, load_history
from groupwise.judge.evaluate import load_labelled
from groupwise.mcp.types import GeneratedScenarioCollection
from groupwise.core.readers import RowError, json_lines, parse_json
from groupwise.runs.store import RunStore
from groupwise.training.checkpoint import list_checkpoints, read_state_or_why
from groupwise.utils.sft import iterate_file

from groupwise.jobs.sft import read_jsonl as read_sft

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# JSON values of every kind, NaN and inf floats included (json.dumps writes them as NaN / Infinity).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
# ...and objects shaped like the formats' rows, with any value in any field: closer to a real mistake.
sft_like = st.fixed_dictionaries({"messages": json_values | st.lists(st.fixed_dictionaries(
    {"role": json_values, "content": json_values}), max_size=3)}, optional={"tools": json_values})
label_like = st.fixed_dictionaries({"messages": json_values | st.just([]), "trajectories": json_values | st.lists(
    st.fixed_dictionaries({}, optional={"answer": json_values, "messages": json_values, "label": json_values}),
    max_size=3)}) | st.fixed_dictionaries({"chosen": json_values, "rejected": json_values})
lines_of_values = st.lists(json_values | sft_like | label_like, min_size=1, max_size=5)
lines_of_bytes = st.lists(st.binary(max_size=40), min_size=1, max_size=5)


def _write_values(path: Path, values: list) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return path


def _write_bytes(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _one_line_error_names(exc: BaseException, path: Path) -> None:
    """The reader's error: a RowError (an InvalidDataError) whose one-line message names path:line."""
    assert isinstance(exc, RowError), f"{type(exc).__name__}: {exc}"
    assert isinstance(exc, InvalidDataError)
    assert re.match(re.escape(str(path)) + r":\d+: ", str(exc)), str(exc)
    assert "\n" not in str(exc) and "expected" in str(exc)


def _reads_or_names_the_line(read, path: Path) -> None:
    try:
        read(path)
    except RowError as exc:
        _one_line_error_names(exc, path)
    except InvalidDataError as exc:  # a whole file of blank lines: "holds no demonstrations"
        assert str(path) in str(exc) and "no demonstrations" in str(exc)


READERS = {
    "sft": read_sft,
    "sft-iterate": lambda p: list(iterate_file(str(p), shuffle_buffer_size=2)),
    "labels": load_labelled,
}


@pytest.mark.parametrize("reader", sorted(READERS))
@FUZZ
@given(values=lines_of_values)
def test_any_json_line_is_a_row_or_one_error_naming_its_line(tmp_path, reader, values):
    _reads_or_names_the_line(READERS[reader], _write_values(tmp_path / "data.jsonl", values))


@pytest.mark.parametrize("reader", sorted(READERS))
@FUZZ
@given(lines=lines_of_bytes)
def test_any_bytes_are_rows_or_one_error_naming_the_line(tmp_path, reader, lines):
    _reads_or_names_the_line(READERS[reader], _write_bytes(tmp_path / "data.jsonl", lines))


SFT_OK = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
GROUP_OK = {"messages": [{"role": "user", "content": "2+2?"}],
            "trajectories": [{"answer": "4", "label": 1}, {"answer": "5", "label": 0}]}
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("line, says", [
    ("[1, 2]", "holds an array of 2, not an object"),
    ('"text"', "holds the string 'text', not an object"),
    ("5", "holds the number 5, not an object"),
    ("null", "holds null, not an object"),
    (DEEP, "nested deeper than it can be read"),
    ('{"messages": ' + DEEP + "}", "nested deeper than it can be read"),
    ('{"messages": []}', "messages: List should have at least 1 item"),
    ('{"messages": [{"content": "x"}]}', "messages.0.role: missing"),
    ('{"messages": "hi"}', "messages: Input should be a valid list"),
    ('{"messages": [{"role": "user", "content": "x"}], "tools": 3}', "tools: "),
    ('{"messages": [{"role": "user", "content": NaN}]}', "NaN where a number is meant"),
    ('{"messages": [{"role": "wizard", "content": "x"}]}', "wizard"),  # Trajectory's own check, same shape
    ("{\"messages\": [", "not valid JSON"),
])
def test_sft_rows_the_issue_names(tmp_path, line, says):
    path = tmp_path / "demos.jsonl"
    path.write_text(json.dumps(SFT_OK) + "\n" + line + "\n")
    with pytest.raises(RowError) as info:
        read_sft(path)
    _one_line_error_names(info.value, path)
    assert str(info.value).startswith(f"{path}:2: ") and says in str(info.value)


@pytest.mark.parametrize("label, says", [
    ('"0.8"', "label: a finite number, got the string '0.8'"),
    ("null", "label: a finite number, got null"),
    ("true", "label: a finite number, got true"),
    ("NaN", "NaN where a number is meant"),
    ("Infinity", "Infinity where a number is meant"),
    ("-Infinity", "-Infinity where a number is meant"),
    ("1e400", "the number 1e400 is past a float's range"),
    ("1" + "0" * 400, "an integer past a float's range"),
    ("[1]", "label: a finite number, got an array of 1"),
    (None, "label: missing"),
])
def test_labels_that_are_text_null_nan_or_missing_are_one_error(tmp_path, label, says):
    second = '{"answer": "5"}' if label is None else '{"answer": "5", "label": ' + label + "}"
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps(GROUP_OK) + '\n{"trajectories": [{"answer": "4", "label": 1}, ' + second + "]}\n")
    with pytest.raises(RowError) as info:
        load_labelled(path)
    _one_line_error_names(info.value, path)
    assert str(info.value).startswith(f"{path}:2: ") and says in str(info.value), str(info.value)


@pytest.mark.parametrize("line, says", [
    ("[1]", "holds an array of 1"),
    ('"x"', "holds the string 'x'"),
    ("7", "holds the number 7"),
    (DEEP, "nested deeper"),
    ('{"messages": []}', "holds keys ['messages']"),
    ('{"trajectories": [{"answer": "a", "label": 1}]}', "at least 2 items"),
    ('{"chosen": "a"}', "rejected: missing"),
    ('{"chosen": 3, "rejected": "b"}', "chosen"),
])
def test_label_rows_that_are_not_groups_are_one_error(tmp_path, line, says):
    path = tmp_path / "labels.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(RowError) as info:
        load_labelled(path)
    _one_line_error_names(info.value, path)
    assert says in str(info.value), str(info.value)


def test_a_byte_order_mark_and_crlf_line_ends_are_accepted(tmp_path):
    sft = tmp_path / "demos.jsonl"
    sft.write_bytes(b"\xef\xbb\xbf" + (json.dumps(SFT_OK) + "\r\n").encode() * 2)
    assert len(read_sft(sft)) == 2 and len(list(iterate_file(str(sft)))) == 2
    labels = tmp_path / "labels.jsonl"
    labels.write_bytes(b"\xef\xbb\xbf" + (json.dumps(GROUP_OK) + "\r\n").encode())
    [group] = load_labelled(labels)
    assert group.labels == [1.0, 0.0]
    # a mark anywhere but the start is not whitespace to JSON: the line is named
    sft.write_bytes((json.dumps(SFT_OK) + "\n").encode() + b"\xef\xbb\xbf" + json.dumps(SFT_OK).encode())
    with pytest.raises(RowError, match=r"demos.jsonl:2: not valid JSON"):
        read_sft(sft)


def test_a_missing_file_is_one_error(tmp_path):
    with pytest.raises(InvalidDataError, match="cannot be read"):
        load_labelled(tmp_path / "nope.jsonl")
    with pytest.raises(InvalidDataError, match="cannot be read"):
        read_sft(tmp_path)  # a folder


@FUZZ
@given(values=st.lists(json_values, min_size=1, max_size=4))
def test_strict_json_refuses_every_non_finite_number(values):
    text = json.dumps(values)
    if any(isinstance(x, float) and not math.isfinite(x) for x in _leaves(values)):
        with pytest.raises(InvalidDataError, match="where a number is meant"):
            parse_json(text)
    else:
        assert parse_json(text) == values
    assert json.dumps(parse_json(text, allow_nan=True)) == text  # the store's own files keep them


def _leaves(v):
    if isinstance(v, dict):
        for x in v.values():
            yield from _leaves(x)
    elif isinstance(v, list):
        for x in v:
            yield from _leaves(x)
    else:
        yield v


# ------------------------------------------------------------------ scenarios (ART's mcp collection)

@FUZZ
@given(value=json_values | st.fixed_dictionaries({"scenarios": st.lists(st.fixed_dictionaries(
    {"task": json_values, "difficulty": json_values}), max_size=3)}))
def test_scenarios_json_is_a_collection_or_one_error(value):
    text = json.dumps(value)
    try:
        collection = GeneratedScenarioCollection.from_json(text)
    except InvalidDataError as exc:
        assert "\n" not in str(exc)
    else:
        assert all(isinstance(s.task, str) and 1 <= s.difficulty <= 5 for s in collection)


def test_scenarios_json_samples():
    ok = GeneratedScenarioCollection.from_json('\ufeff{"scenarios": [{"task": "t", "difficulty": 2}]}'[1:])
    assert [s.task for s in ok] == ["t"]
    for text, says in [("[" * 100_000, "nested deeper"), ('{"scenarios": 3}', "got the number 3"),
                       ('[{"task": "t", "difficulty": NaN}]', "NaN where a number is meant"),
                       ('[{"task": "t", "difficulty": "2"}]', "scenario 0: difficulty"),
                       ('[{"task": "t", "difficulty": 9}]', "scenario 0: difficulty: Input should be less than or equal")]:
        with pytest.raises(InvalidDataError, match=re.escape(says)):
            GeneratedScenarioCollection.from_json(text)


# ------------------------------------------------------------- a run's files, edited by hand, on resume

def _history(tmp_path: Path, lines: list[bytes]) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "history.jsonl").write_bytes(b'{"step": 0, "split": "train", "reward": 0.5}\n' + b"\n".join(lines) + b"\n")
    return run


@FUZZ
@given(lines=lines_of_bytes | st.lists(json_values.map(lambda v: json.dumps(v).encode()), min_size=1, max_size=4))
def test_a_hand_edited_history_skips_bad_lines_by_name_and_keeps_the_rest(tmp_path, lines):
    run = _history(tmp_path, lines)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = load_history(run, skip_corrupt=True)
        mirror = RunHistory(run).snapshot()  # what a resumed run holds
    assert rows[0]["step"] == 0 and mirror == rows
    assert all(isinstance(r["step"], int) and r["step"] >= 0 and isinstance(r["split"], str) for r in rows)
    for w in caught:
        assert issubclass(w.category, GroupwiseWarning) and re.match(r".*history\.jsonl:\d+: skipped", str(w.message))
    try:
        load_history(run)
    except CorruptRecordError as exc:
        assert re.search(r"history\.jsonl:\d+: corrupt record", str(exc)) and "\n" not in str(exc)


def test_history_samples_deep_nesting_and_rows_that_are_not_rows(tmp_path):
    deep_row = ('{"step": 1, "split": "val", "x": ' + DEEP + "}").encode()  # ends as a whole row does: not torn
    run = _history(tmp_path, [deep_row, b'{"step": "5", "split": "train"}', b'{"step": 1.5, "split": "val"}',
                              b'{"step": 2, "split": 3}', b'[1]', b'{"step": 3, "split": "val", "reward": 1}'])
    with pytest.warns(GroupwiseWarning) as caught:
        rows = RunHistory(run).snapshot()
    assert [r["step"] for r in rows] == [0, 3]
    assert [re.search(r"history\.jsonl:(\d+)", str(w.message)).group(1) for w in caught] == ["2", "3", "4", "5", "6"]
    with pytest.raises(CorruptRecordError, match=r"history\.jsonl:2: corrupt record \(JSON nested deeper"):
        load_history(run)


@pytest.mark.parametrize("text, says", [
    ("[" * 100_000, "nested deeper"), ("[1, 2]", "state must be a JSON object, not an array of 2"),
    ('"x"', "not the string 'x'"), ("{\n  \"a\": \n}", "state.json:3: corrupt record (not valid JSON"),
])
def test_a_hand_edited_run_state_is_one_error_naming_the_file(tmp_path, text, says):
    store = RunStore(tmp_path, "p", "m")
    store.state_path.parent.mkdir(parents=True, exist_ok=True)
    store.state_path.write_text(text)
    with pytest.raises(CorruptRecordError, match=re.escape(says)):
        store.read_state()
    store.state_path.write_bytes(b'\xef\xbb\xbf{"a": NaN}')  # a mark is accepted; the run's own NaN read back
    assert math.isnan(store.read_state()["a"])


def test_hand_edited_metrics_totals_in_the_run_state_are_refused_naming_the_key(tmp_path):
    import groupwise as gw
    from groupwise.model import METRICS_STATE_KEY

    model = gw.Model(name="m", project="p", base_path=str(tmp_path))
    model.store.state_path.parent.mkdir(parents=True, exist_ok=True)
    model.store.write_state({METRICS_STATE_KEY: {"cum_state": {"costs/train": "abc"}}})
    with pytest.raises(CorruptRecordError, match=r"state\.json:1: corrupt record \(.*cum_state\.costs/train: a finite "
                                                 r"number, got the string 'abc'"):
        model.metrics_builder()


@pytest.mark.parametrize("text, says", [
    ('{"step": "5"}', "step: Input should be a valid integer"), ('{"step": -1}', "step: Input should be greater"),
    ('{"step": 1.5}', "step: Input should be a valid integer"), ("[" * 100_000, "nested deeper"),
    ("[]", "holds an array of 0"), ('{"step": 1, "history": 3}', "history: Input should be a valid list"),
])
def test_a_hand_edited_checkpoint_state_is_skipped_saying_why(tmp_path, text, says):
    ckpt = tmp_path / "checkpoints" / "0001"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(text)
    assert says in read_state_or_why(ckpt)
    with pytest.warns(GroupwiseWarning, match=re.escape(says)):
        assert list_checkpoints(tmp_path / "checkpoints") == []
    (ckpt / "state.json").write_bytes(b'\xef\xbb\xbf{"step": 1, "metrics": {"loss": Infinity}}')
    [state] = list_checkpoints(tmp_path / "checkpoints")
    assert state.step == 1


def test_json_lines_reads_as_it_goes(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n[\n')
    rows = json_lines(path, expected="x")
    assert next(rows) == (1, {"a": 1})  # the bad line 2 is not read yet
    with pytest.raises(RowError, match=r"a.jsonl:2: not valid JSON"):
        next(rows)
