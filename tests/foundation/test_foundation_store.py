"""The run store: lossless round-trip, history rows, atomic writes, corrupt lines."""

from __future__ import annotations

import json
import math

import pytest

from groupwise import CorruptRecordError, StoreError, Trajectory, TrajectoryGroup, load_history, load_trajectories
from groupwise.core.choices import choice_forced_indices, choice_logprobs, choice_token_ids
from groupwise.runs.store import RunStore, history_row, metrics_row, read_group_dicts
from groupwise.core.trajectory import Choice


def test_every_field_round_trips_exactly(tmp_path, group):
    store = RunStore(tmp_path, "2048", "agent-001")
    path = store.write_trajectories("train", 3, [group])
    assert path == tmp_path / "2048" / "models" / "agent-001" / "trajectories" / "train" / "0003.jsonl"
    [back] = load_trajectories(store.run_dir)
    assert back == group  # every field of the group: trajectories, exceptions, metadata, metrics, logs
    assert back.trajectories == group.trajectories
    t, t0 = back.trajectories[0], group.trajectories[0]
    assert t.model_dump() == t0.model_dump()
    # Token-in/token-out survives: ids in the Choice's extra field, logprobs per token (-inf too).
    choice = t.messages_and_choices[2]
    assert choice_token_ids(choice) == [11, 12, 13]
    assert choice_logprobs(choice) == [-0.1, -2.5, -math.inf]
    assert choice_logprobs(t.messages_and_choices[4]) == [-0.015625, -1.0000000000000002]  # exact floats
    assert choice.message.tool_calls[0].function.arguments == '{"direction": "left"}'
    assert choice_token_ids(t.additional_histories[0].messages_and_choices[1]) == [5]
    assert t.tools == t0.tools
    assert (t.initial_policy_version, t.final_policy_version) == (2, 3)
    assert t.metrics == {"max_tile": 64, "won": False, "moves": 12.5}
    assert type(t.metrics["max_tile"]) is int and type(t.metrics["won"]) is bool
    assert t.metadata == {"game_id": "g-1", "seed": 3, "note": None, "hard": True, "temp": 0.7}
    assert t.logs == t0.logs
    assert back.exceptions[0].type == "ValueError" and back.exceptions[0].message == "rollout 3 failed"
    # A second write-read cycle is byte-identical: nothing drifts.
    store.write_trajectories("train", 4, [back])
    assert (store.run_dir / "trajectories/train/0004.jsonl").read_bytes() == path.read_bytes()


def test_grammar_forced_indices_round_trip(tmp_path, group):
    traj = group.trajectories[0]
    choice = traj.messages_and_choices[2]
    traj.messages_and_choices[2] = Choice.model_validate({**choice.model_dump(), "forced_token_indices": [0, 2]})
    store = RunStore(tmp_path, "p", "m")
    store.write_trajectories("train", 0, [group])
    [back] = load_trajectories(store.run_dir)
    assert choice_forced_indices(back.trajectories[0].messages_and_choices[2]) == [0, 2]
    assert choice_forced_indices(back.trajectories[0].messages_and_choices[4]) == []  # none recorded


def test_load_filters_by_split_and_step(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    store.write_trajectories("train", 0, [group])
    store.write_trajectories("train", 1, [group, group])
    store.write_trajectories("val", 1, [group])
    assert len(load_trajectories(store.run_dir)) == 4
    assert len(load_trajectories(store.run_dir, split="train")) == 3
    assert len(load_trajectories(store.run_dir, step=1)) == 3
    assert len(load_trajectories(store.run_dir, split="val", step=0)) == 0


def test_atomic_writes_leave_no_temp_files(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    store.write_trajectories("val", 0, [group])
    store.write_trajectories("val", 0, [group, group])  # rewrite (a resumed run re-logs its step)
    store.write_state({"step": 2, "best": {"step": 1, "reward": 0.5}})
    files = sorted(p.name for p in store.run_dir.rglob("*") if p.is_file())
    assert files == ["0000.jsonl", "0000.summary.json", "state.json"]
    assert len(load_trajectories(store.run_dir)) == 2
    assert store.read_state() == {"step": 2, "best": {"step": 1, "reward": 0.5}}


def test_state_defaults_to_empty(tmp_path):
    assert RunStore(tmp_path, "p", "m").read_state() == {}


def test_corrupt_line_names_file_and_line_and_skip_corrupt_reads_the_rest(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("train", 0, [group, group, group])
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:40] + "\n"  # a torn line
    path.write_text("".join(lines))
    with pytest.raises(CorruptRecordError) as err:
        load_trajectories(store.run_dir)
    assert err.value.line == 2 and err.value.path == str(path)
    assert f"{path}:2: corrupt record" in str(err.value) and "skip_corrupt=True" in str(err.value)
    assert load_trajectories(store.run_dir, skip_corrupt=True) == [group, group]


def test_valid_json_that_is_not_a_group_is_corrupt(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("train", 0, [group])
    path.write_text(path.read_text() + '{"trajectories": [{"messages_and_choices": [], "reward": "x"}]}\n')
    with pytest.raises(CorruptRecordError, match=r"0000.jsonl:2: corrupt record \(not a TrajectoryGroup"):
        load_trajectories(store.run_dir)


def test_group_dicts_are_the_stored_rows_unvalidated_with_the_same_lines_skipped(tmp_path, group):
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("train", 0, [group, group, group])
    rows = read_group_dicts(path)
    assert rows == [json.loads(line) for line in path.read_text().splitlines()]
    assert [TrajectoryGroup.model_validate(r) for r in rows] == [group] * 3
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1][:40] + "\n"  # a torn line
    path.write_text("".join(lines) + '[1, 2]\n')  # and valid JSON that is no group
    with pytest.raises(CorruptRecordError) as err:
        read_group_dicts(path)
    assert err.value.line == 2
    with pytest.warns(Warning, match=r"0000.jsonl:4: skipped \(not a TrajectoryGroup"):
        kept = read_group_dicts(path, skip_corrupt=True)
    assert kept == [rows[0], rows[2]]


def test_history_row_of_rewards_near_the_float_limit_is_finite():
    # Finite rewards whose sum leaves float's range: the row is written after the update, so an overflow
    # there would fail the step between its update and its checkpoint and wedge the run.
    big = 1.7e308
    g = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "q"}], reward=r)
                         for r in (big, big, -big / 2)])
    row = history_row([g], step=0, split="train")
    assert row["reward"] == pytest.approx(big / 2) and math.isfinite(row["reward_std"])


def test_history_row_schema_and_numbers():
    def traj(r, **m):
        return Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=r, metrics=m)

    g1 = TrajectoryGroup([traj(1.0, moves=4), traj(0.0, moves=2)], metrics={"judge_cost": 0.5})
    g2 = TrajectoryGroup([traj(1.0), traj(1.0, moves=6)], exceptions=[RuntimeError("x")])
    row = history_row([g1, g2], step=7, split="val", metrics={"loss": 0.25})
    assert set(row) == {"step", "split", "recorded_at", "reward", "reward_std", "reward_std_within_group",
                        "reward_std_dev", "n_groups", "n_trajectories", "n_exceptions", "exception_rate", "moves",
                        "group_judge_cost", "loss"}
    assert (row["step"], row["split"]) == (7, "val")
    assert row["reward"] == 0.75                       # (1 + 0 + 1 + 1) / 4
    assert row["reward_std"] == pytest.approx(0.4330127018922193)  # sqrt(mean((r-0.75)^2)) = sqrt(3/16)
    assert row["reward_std_within_group"] == 0.25      # (pstdev(1,0)=0.5 + pstdev(1,1)=0) / 2
    assert (row["n_groups"], row["n_trajectories"], row["n_exceptions"]) == (2, 4, 1)
    assert row["exception_rate"] == 0.2                # 1 / (4 + 1)
    assert row["moves"] == 4.0                         # (4 + 2 + 6) / 3: only trajectories reporting it
    assert row["group_judge_cost"] == 0.5 and row["loss"] == 0.25


def test_reserved_metric_name_is_an_error():
    g = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], metrics={"reward": 1})])
    with pytest.raises(StoreError, match=r"\['reward'\] clash"):
        history_row([g], step=0, split="val")


def test_the_callers_metrics_replace_the_rows_computed_fields_as_in_art():
    """ART's model.log merges the caller's `metrics` last: its train-rl skill logs a validation it scored
    itself as ``model.log(val_groups, metrics={"reward": score}, split="val")``, and delete_checkpoints
    reads that val/reward. The row's identity (step, split, recorded_at) stays its own."""
    g = TrajectoryGroup([Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=r) for r in (0, 1)])
    row = history_row([g], step=2, split="val", metrics={"reward": 0.9, "exception_rate": 0.25, "acc": 1.0})
    assert (row["reward"], row["exception_rate"], row["acc"]) == (0.9, 0.25, 1.0)
    assert (row["step"], row["split"], row["n_trajectories"], row["reward_std"]) == (2, "val", 2, 0.5)
    assert metrics_row(step=1, split="val", metrics={"reward": 0.5})["reward"] == 0.5
    for name in ("step", "split", "recorded_at"):
        with pytest.raises(StoreError, match=rf"\['{name}'\] name the history row itself"):
            history_row([g], step=2, split="val", metrics={name: 1})


def test_a_reward_metric_equal_to_the_reward_is_the_rows_own():
    """ART's examples copy the reward into the metrics (codenames: `metrics["reward"] = reward`); ART
    pools both into one mean. Equal to the trajectory's reward it adds nothing, so it is accepted;
    one that differs still clashes."""
    def traj(reward, metric):
        return Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=reward,
                          metrics={"reward": metric, "win": metric})

    row = history_row([TrajectoryGroup([traj(1.0, 1), traj(0.0, 0.0)])], step=0, split="val")
    assert (row["reward"], row["win"]) == (0.5, 0.5)
    with pytest.raises(StoreError, match=r"\['reward'\] clash"):
        history_row([TrajectoryGroup([traj(1.0, 1), traj(0.0, 0.5)])], step=0, split="val")


def test_history_append_and_torn_last_line(tmp_path):
    store = RunStore(tmp_path, "p", "m")
    store.append_history({"step": 0, "split": "val", "reward": 0.5})
    with open(store.history_path, "a") as f:
        f.write('{"step": 1, "spl')  # a crash mid-append
    with pytest.warns(UserWarning, match=r"history.jsonl:2: skipped \(a line cut short by a crash"):
        assert [r["step"] for r in load_history(store.run_dir)] == [0]
    store.append_history({"step": 1, "split": "val", "reward": None})  # no value is null, never NaN
    with pytest.warns(UserWarning, match=r"history.jsonl:2: skipped"):
        rows = store.history()
    assert [r["step"] for r in rows] == [0, 1]  # the new row started on a fresh line
    assert rows[1]["reward"] is None
    assert json.loads(store.history_path.read_text().splitlines()[0]) == {"step": 0, "split": "val", "reward": 0.5}


def test_a_line_torn_inside_a_character_is_skipped_and_the_history_goes_on(tmp_path, group):
    # Rows are written as UTF-8 with their text as is (a metric "précision", an alert "reward ≥ 0.9"). A
    # crash mid-append that cut a character in two left bytes that are not UTF-8, and every later read
    # raised UnicodeDecodeError, skip_corrupt or not: the run could not log, resume or be charted again.
    store = RunStore(tmp_path, "p", "m")
    store.append_history({"step": 0, "split": "val", "précision": 0.5})
    whole = store.history_path.read_bytes()
    store.history_path.write_bytes(whole + '{"step": 1, "split": "val", "message": "reward ≥'.encode()[:-2])
    with pytest.warns(UserWarning, match=r"history.jsonl:2: skipped \(a line cut short by a crash"):
        assert load_history(store.run_dir) == [{"step": 0, "split": "val", "précision": 0.5}]
    with pytest.warns(UserWarning, match=r"history.jsonl:2: skipped \(a line cut short by a crash"):
        RunStore(tmp_path, "p", "m").append_history({"step": 1, "split": "val", "reward": 1.0})
    with pytest.warns(UserWarning, match=r"history.jsonl:2: skipped"):
        assert [r["step"] for r in load_history(store.run_dir)] == [0, 1]

    # a byte that is not UTF-8 inside a whole line is a corrupt record, named, or skipped when asked
    store.history_path.write_bytes(whole.replace("é".encode(), b"\xff"))
    with pytest.raises(CorruptRecordError, match=r"history.jsonl:1: corrupt record \(not UTF-8 text"):
        load_history(store.run_dir)
    with pytest.warns(UserWarning, match=r"history.jsonl:1: skipped \(not UTF-8 text"):
        assert load_history(store.run_dir, skip_corrupt=True) == []
    path = store.write_trajectories("val", 0, [group])
    path.write_bytes(path.read_bytes().replace("ü".encode(), b"\xfc", 1))
    with pytest.raises(CorruptRecordError, match=r"0000.jsonl:1: corrupt record \(not UTF-8 text"):
        store.load_trajectories("val")
    store.state_path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(CorruptRecordError, match=r"state.json:1: corrupt record \(not UTF-8 text"):
        store.read_state()


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85"])  # JSON escapes the others
def test_a_row_holding_a_unicode_line_separator_survives_a_reload_and_a_rewrite(tmp_path, separator):
    # Rows are written as UTF-8 with their text as is, so U+2028 or NEL stays raw in the line; the
    # history's writer split the file with str.splitlines, which breaks lines there too. A process that
    # loaded the history again (a resumed run) lost such a row, and its next rewrite (a row replaced by
    # key) wrote the two halves back as two corrupt lines: the row was gone, and every read failed.
    from groupwise.runs.history import RunHistory

    store = RunStore(tmp_path, "p", "m")
    alert = {"step": 0, "split": "val", "kind": "alert", "message": f"the reply said a{separator}b"}
    store.append_history(alert)
    store.append_history({"step": 1, "split": "val", "reward": 0.5})
    resumed = RunHistory(store.run_dir)  # what a new process reads
    assert list(resumed) == [alert, {"step": 1, "split": "val", "reward": 0.5}]
    resumed.append({"step": 1, "split": "val", "reward": 0.75})  # replaces its row: a rewrite
    assert load_history(store.run_dir) == [alert, {"step": 1, "split": "val", "reward": 0.75}]


def test_names_that_cannot_be_folders_are_rejected(tmp_path):
    with pytest.raises(StoreError, match="model name='a/b'"):
        RunStore(tmp_path, "p", "a/b")
    with pytest.raises(StoreError, match="project='..'"):
        RunStore(tmp_path, "..", "m")
    with pytest.raises(StoreError, match="split='../x'"):
        RunStore(tmp_path, "p", "m").write_trajectories("../x", 0, [])
    # a file system takes 255 bytes a name: a longer one failed later, as an OSError from mkdir
    RunStore(tmp_path, "p", "m" * 128).run_dir.mkdir(parents=True)
    with pytest.raises(StoreError, match="at most 128 characters"):
        RunStore(tmp_path, "p", "m" * 300)


def test_a_name_with_a_trailing_newline_is_no_folder_name(tmp_path):
    # Python's `$` also matches before a final newline, so "agent\n" (a name read from a file's line)
    # passed the check: the run went into a folder "agent\n" beside "agent", listed the same way.
    with pytest.raises(StoreError, match=r"model name='agent\\n' cannot be a folder name"):
        RunStore(tmp_path, "p", "agent\n")
    with pytest.raises(StoreError, match=r"project='p\\n' cannot be a folder name"):
        RunStore(tmp_path, "p\n", "agent")
    with pytest.raises(StoreError, match=r"split='val\\n'"):
        RunStore(tmp_path, "p", "agent").trajectories_path("val\n", 0)
    assert not list(tmp_path.iterdir())


def test_missing_run_dir_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="does not exist"):
        load_trajectories(tmp_path / "nope")
    assert load_history(tmp_path / "nope") == []


def test_concurrent_history_appends_lose_no_row(tmp_path):
    # 4 threads x 50 appends through separate RunStore objects (as a loop and a backend would hold).
    from concurrent.futures import ThreadPoolExecutor

    def writer(w):
        store = RunStore(tmp_path, "p", "m")
        for i in range(50):
            store.append_history({"step": i, "split": f"w{w}", "pad": "x" * 500})

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, range(4)))
    rows = load_history(RunStore(tmp_path, "p", "m").run_dir)
    assert len(rows) == 200
    for w in range(4):
        assert [r["step"] for r in rows if r["split"] == f"w{w}"] == list(range(50))


def test_lone_surrogates_anywhere_are_stored_and_round_trip(tmp_path, group):
    """Text a model produced may hold lone surrogates (JSON ``"\\ud800"`` parses to one); they have no
    UTF-8 encoding and used to fail the whole step's write with UnicodeEncodeError."""
    from foundation_helpers import make_choice

    class Broken(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    t = group.trajectories[0].model_copy(deep=True)
    t.messages_and_choices.append(make_choice("half an emoji \ud83d, a tail \udfff", [9], [-0.5]))
    t.messages_and_choices.append({"role": "user", "content": "\ud800"})
    t.metadata["answer"] = "\udbff"
    t.logs.append("tool error: no email with message_id '\ud800'")
    odd = TrajectoryGroup([t], exceptions=[ValueError("reply was \ud800"), Broken()], metadata={"q": "\udc00"},
                          logs=["\udfff"])
    store = RunStore(tmp_path, "p", "m")
    path = store.write_trajectories("train", 0, [odd, group])
    path.read_bytes().decode("utf-8")  # the file is valid UTF-8 ...
    assert store.load_trajectories("train", 0) == [odd, group]  # ... and every character comes back
    assert odd.exceptions[1].type == "Broken" and "str() of the Broken failed" in odd.exceptions[1].message
    store.append_history({"step": 0, "split": "alert", "name": "degenerate", "message": "answer '\ud800' x8"})
    store.append_history({"step": 0, "split": "alert", "name": "degenerate", "message": "answer '\ud800' x8", "n": 2})
    assert store.history() == [{"step": 0, "split": "alert", "name": "degenerate", "message": "answer '\ud800' x8", "n": 2}]
    # A dict KEY holding one is the exception: pydantic's JSON dump writes it as U+FFFD (the store's doc).
    keyed = TrajectoryGroup([t.model_copy(update={"metadata": {"k\udc80": "\ud800"}})])
    store.write_trajectories("train", 1, [keyed])
    assert store.load_trajectories("train", 1)[0].trajectories[0].metadata == {"k\ufffd\ufffd\ufffd": "\ud800"}


def _nested(levels: int) -> dict:
    d: dict = {"type": "string"}
    for _ in range(levels):
        d = {"type": "object", "properties": {"a": d}}
    return d


@pytest.mark.parametrize("where,hostile", [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": _nested(300)}}]),
    ("message", {"role": "user", "content": "x", "extra": _nested(300)}),
    ("message", {"role": "user", "content": "x", "extra": b"\xff\xfe"}),
    ("message", {"role": "user", "content": "x", "extra": object()}),
    ("message", {"role": "user", "content": "x", "extra": 10**5000}),
    ("metadata", 10**5000),
    ("metric", 10**400),
], ids=["deep-tool-schema", "deep-message", "bad-utf8-bytes", "object", "int-5000-digits", "metadata-int", "metric-int"])
def test_a_group_the_writer_would_refuse_is_refused_before_the_step(tmp_path, where, hostile):
    # Each of these was accepted by check_storable, which the trainer calls before its update; the write
    # then failed (pydantic's depth limit, bad UTF-8, an unknown type, Python's int-to-text limit, a
    # metric's float()) after the adapter had been updated, and the run refused every further step until
    # it was loaded again. Now the check refuses them, naming where, and nothing is written.
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    kwargs: dict = {}
    if where == "tools":
        kwargs["tools"] = hostile
    elif where == "message":
        messages[0] = hostile
    elif where == "metadata":
        kwargs["metadata"] = {"m": hostile}
    else:
        kwargs["metrics"] = {"m": hostile}
    group = TrajectoryGroup([Trajectory(messages_and_choices=messages, reward=1.0, **kwargs)])
    store = RunStore(tmp_path, "p", "agent")
    with pytest.raises(StoreError, match=r"groups\[0\]\.trajectories\[0\]"):
        store.check_storable([group])
    with pytest.raises(StoreError):
        store.write_trajectories("train", 0, [group])
    assert not store.trajectories_path("train", 0).exists()


def test_values_pydantic_writes_are_storable(tmp_path, group):
    import datetime

    from groupwise.runs.store import MAX_NESTING

    odd = {"role": "user", "content": "x", "when": datetime.date(2024, 1, 2), "ids": {1, 2}, "keys": {3: "three"},
           "deep": _nested(MAX_NESTING // 2 - 1), "big": 10**4000, "nan": math.nan}
    g = TrajectoryGroup([Trajectory(messages_and_choices=[odd, {"role": "assistant", "content": "a"}], reward=1.0,
                                    metrics={"m": 10**300})])
    store = RunStore(tmp_path, "p", "agent")
    assert store.check_storable([g, group]) == [g, group]
    store.write_trajectories("train", 0, [g, group])
    [back, _] = load_trajectories(store.run_dir)
    assert back.trajectories[0].messages_and_choices[0]["keys"] == {"3": "three"}
    assert history_row([g], step=0, split="train")["m"] == 1e300


def _set(path: str, value):
    """A mutation of a built trajectory, the way a rollout makes it: ``t.metrics["x"] = value``."""
    def mutate(t: Trajectory) -> None:
        target = {"metrics": t.metrics, "metadata": t.metadata, "logs": t.logs, "messages": t.messages_and_choices,
                  "history": t.additional_histories[0].messages_and_choices}[path]
        if isinstance(target, list):
            target.append(value)
        else:
            target["x"] = value
    return mutate


@pytest.mark.parametrize("mutate,where", [
    (_set("metrics", None), r"metrics\.x"),
    (_set("metrics", "0.8"), r"metrics"),
    (_set("metrics", [1.0]), r"metrics\.x"),
    (_set("metrics", 1j), r"metrics\.x"),
    (_set("logs", 5), r"logs\[2\]"),
    (_set("messages", {"role": "robot", "content": "x"}), r"messages_and_choices"),
    (_set("messages", "a reply"), r"messages_and_choices"),
    (_set("history", {"content": "no role"}), r"additional_histories\[0\]\.messages_and_choices"),
], ids=["metric-None", "metric-text", "metric-list", "metric-complex", "log-int",
        "role-robot", "message-str", "history-no-role"])
def test_a_value_set_after_the_trajectory_was_built_is_checked_before_the_step(tmp_path, group, mutate, where):
    # A rollout fills a trajectory in place (``t.metrics["x"] = ...``, ``t.messages_and_choices.append``),
    # which pydantic does not see. Such a value was written as a line that load_trajectories then refused
    # (CorruptRecordError on every later read of the step: inspect, compare, judge eval, load_trajectories),
    # and a metric that float() refuses failed the step's history row after the update. Now the check
    # the trainer runs before its update refuses it, naming where, and nothing is written.
    mutate(group.trajectories[0])
    store = RunStore(tmp_path, "p", "agent")
    with pytest.raises(StoreError, match=rf"groups\[0\]\.trajectories\[0\]\.?{where}") as raised:
        store.check_storable([group])
    assert "after the trajectory was built" in str(raised.value)
    with pytest.raises(StoreError):
        store.write_trajectories("train", 0, [group])
    assert not store.trajectories_path("train", 0).exists()


@pytest.mark.parametrize("name", ["n_groups", "reward"])
def test_a_metric_named_like_a_history_field_is_refused_before_the_step(tmp_path, name):
    # history_row refuses such a name, but the trainer builds that row after its update: the step then
    # failed with the adapter updated and no checkpoint, blocking the run until it was loaded again.
    # (A "reward" metric equal to the trajectory's reward is the row's own, and accepted.)
    t = Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=1.0)
    t.metrics[name] = 0.5
    copy = Trajectory(messages_and_choices=[{"role": "user", "content": "x"}], reward=1.0, metrics={"reward": 1})
    store = RunStore(tmp_path, "p", "agent")
    with pytest.raises(StoreError, match=rf"groups\[1\]\.trajectories\[0\]: metric name\(s\) \['{name}'\] clash"):
        store.check_storable([TrajectoryGroup([copy]), TrajectoryGroup([t])])
    assert store.check_storable([TrajectoryGroup([copy])])


def test_numpy_and_decimal_values_set_after_the_trajectory_was_built_are_stored_as_numbers(tmp_path, group):
    # Trajectory(metrics={"a": np.float32(0.5)}) stores 0.5, but the same value set in place afterwards
    # (the usual ``t.metrics["acc"] = np.mean(hits)``) reached the writer as a numpy scalar, which it
    # could not serialise: the step's trajectories were lost after its update. A Decimal was written as
    # the text "1.5", which reading refused. Both are now stored as the constructor would store them.
    import decimal

    import numpy as np

    t = group.trajectories[0]
    t.metrics.update(acc=np.float32(0.5), n=np.int64(3), ok=np.bool_(True), cost=decimal.Decimal("1.5"))
    t.metadata["seed"] = np.int32(7)
    group.metrics["judge_cost"] = np.float64(0.25)
    store = RunStore(tmp_path, "p", "agent")
    store.write_trajectories("train", 0, [group])
    [back] = store.load_trajectories("train", 0)
    metrics = back.trajectories[0].metrics
    assert [(metrics[k], type(metrics[k])) for k in ("acc", "n", "ok", "cost")] == [
        (0.5, float), (3, int), (True, bool), (1.5, float)]
    assert back.trajectories[0].metadata["seed"] == 7 and back.metrics["judge_cost"] == 0.25
    assert history_row([group], step=0, split="train")["acc"] == 0.5
