"""A run's history: ``history.jsonl`` on disk, and `RunHistory`, its one writer and in-memory mirror.

The file holds one JSON object per line (the row schema is in `groupwise.runs.store`'s docstring). Readers
outside the training process (`groupwise report`, `inspect`, `compare`, the dashboard) parse it with
`load_history`. The process that trains a run keeps the rows in memory instead (`RunHistory`), because
the loop reads the history several times per step (detectors, stopping rules, the policy, the progress
line) and parsing the whole file each time grows with the run: quadratic over a run.

`RunHistory` is the only code that writes the file, and there is one per run folder per process
(`RunHistory.of`; the backend, the model and the loop reach the same one through `RunStore`), so:

- an append costs one line, whatever the run's length: the row goes into memory (an index from its
  key to its place answers "is it there already?" without reading the file), and its line is written
  with one ``os.write`` under O_APPEND;
- appends are idempotent as the file always was: a row whose key (`history_key`: step, split, kind,
  name, message) is there already replaces that row in place (an atomic rewrite of the file from
  memory: a step redone after a crash, rare), or with ``if_missing`` is left alone (a resume's replay);
- the disk work runs on one writer thread (`write`, awaited by async code: the event loop never waits on
  an fsync), in the order the rows entered memory, so the file is always a prefix of what the mirror
  holds, and every write is on disk (fsynced) when `append`/`write` returns: crash-safe as a synchronous
  append; a write that fails (a full disk) raises, and the mirror reloads the file once no write is
  pending, so it never keeps a row the file lacks;
- readers see a row as soon as it is appended; the mirror rereads the file only when someone else
  changed it (its size, inode or mtime differ from what its own last write left, checked with one
  ``stat``), e.g. a person who truncated it, or a second `RunHistory` after `RunHistory.of` forgot the
  first.

A torn line (a crash mid-append leaves a line that is not a whole JSON object) is skipped with a
warning naming the file and line, and the next append starts on a fresh line. Writers hold an
exclusive ``flock`` on ``.history.lock`` beside the file (when the platform has it), for the
read-modify-write of a rewrite.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import json
import math
import os
import threading
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, overload

from groupwise.chat.text import LONE_SURROGATE
from groupwise.config import DEFAULT_CONFIDENCE
from groupwise.runs.curves import AlertRecord, Point, baseline_points, points_of
from groupwise.errors import CorruptRecordError, GroupwiseWarning, RunFolderError, StoreError
from groupwise.core.readers import JSONProblem, parse_json

try:  # POSIX only; on other platforms appends rely on O_APPEND alone.
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["HISTORY_FILE", "HISTORY_KEY_FIELDS", "RunHistory", "history_key", "load_history", "read_jsonl",
           "dumps", "atomic_write_text", "is_volatile", "non_finite_field", "stable_rows"]

Row = dict[str, Any]
HISTORY_FILE = "history.jsonl"
HISTORY_KEY_FIELDS = ("step", "split", "kind", "name", "message")
# The fields of a row that measure the machine rather than the run, so two runs that are the same run write
# them differently: when the row was written and how long things took (``time/...`` are the loop's phases;
# ``duration`` is the mean of the rollouts' own, `Trajectory.finish`), and ``memory/...`` (the measured peak, and the micro-batch budget admitted against the device's free
# memory at that moment, with the priced peak of that plan: training/step_memory.py).
VOLATILE_FIELDS = frozenset({"recorded_at", "duration", "step_time", "update_time", "trainable_tokens_per_s"})
VOLATILE_PREFIXES = ("time/", "memory/")


def is_volatile(key: str) -> bool:
    """Whether a history field measures the machine, not the run (`VOLATILE_FIELDS`, `VOLATILE_PREFIXES`)."""
    return key in VOLATILE_FIELDS or key.startswith(VOLATILE_PREFIXES)


def stable_rows(rows: Iterable[Row]) -> list[Row]:
    """Each row without its volatile fields, in order: what two runs that are the same run write alike."""
    return [{k: v for k, v in r.items() if not is_volatile(k)} for r in rows]


def non_finite_field(obj: Any, where: str = "") -> tuple[str, float] | None:
    """(the field's name, its value) of the first nan or inf number in `obj` (a row, its nested dicts and
    lists), or None: the writer's check that nothing non-finite reaches history.jsonl."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (where or "the value", obj)
    if isinstance(obj, dict):
        items: Iterator[tuple[Any, Any]] = iter(obj.items())
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        found = non_finite_field(value, f"{where}.{key}" if where else f"field {key!r}" if isinstance(key, str)
                                 else f"field {key}")
        if found is not None:
            return found
    return None


def history_key(row: Row) -> tuple[str, ...]:
    """What identifies a history row (module doc): appending a row with the same key replaces it."""
    return tuple(json.dumps(row.get(k), sort_keys=True) for k in HISTORY_KEY_FIELDS)


# ------------------------------------------------------------------------------------ the file


# What the disk or its permissions refuse (as opposed to a path the caller got wrong): a full or read-only
# disk, a quota (of space, or of a file's size), a folder this user may not write in. A write of the run store that fails so is a
# RunFolderError naming the file, not the system's traceback from the writer's thread.
_CANNOT_WRITE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


def _unwritable(path: str | os.PathLike, exc: OSError) -> OSError:
    """`exc` as a `RunFolderError` naming `path` when the disk refused the write, else `exc` itself."""
    if exc.errno not in _CANNOT_WRITE:
        return exc
    return RunFolderError(
        f"cannot write {str(path)!r} ({exc.strerror}): free space or fix permissions there (or move the run "
        "store to a larger disk and pass it with --path on the command line, base_path= in Python); what was "
        "written before stays, and the same command resumes from the last checkpoint")


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically: temp file in the same folder, fsync, os.replace."""
    import tempfile

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _unwritable(path, exc) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):
            raise _unwritable(path, exc) from None
        raise


def dumps(obj: Any) -> str:
    """One JSON line. allow_nan: a -inf logprob must survive; ensure_ascii=False keeps text readable.

    Text a model produced may hold lone surrogates (a JSON reply with ``"\\ud800"``, parsed by the
    rollout or the openai client, yields one). Such a character is written as its JSON escape
    ``\\ud800``, which `json.loads` reads back as the same character: the record stays valid UTF-8 and
    round-trips, instead of failing the step's write. Two cases do not come back as they were: a high
    surrogate directly followed by a low one (two code points UTF-16 would pair; JSON cannot keep them
    apart) reads back as the single character they pair to, and one in a dict KEY of a pydantic model
    (say a metadata name) is already U+FFFD in pydantic's JSON dump."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=True, separators=(",", ":"))
    if LONE_SURROGATE.search(text):
        # Outside strings json.dumps writes ASCII only, so every surrogate here is inside a string.
        text = LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


def _text_lines(path: Path) -> Iterator[tuple[str, str | None]]:
    """(text, problem) of each line of `path`, newline kept, read as the caller goes (a trajectory file
    may be large). A line whose bytes are not UTF-8 (a crash mid-append that cut a character in two, a
    damaged disk) has its bad bytes as U+FFFD and a problem naming the first; read as one text, the file
    raised UnicodeDecodeError at every later read."""
    with open(path, "rb") as f:
        for raw in f:
            try:
                yield raw.decode("utf-8"), None
            except UnicodeDecodeError as exc:
                yield raw.decode("utf-8", errors="replace"), f"not UTF-8 text (byte {exc.start} of the line)"


def _torn(line: str) -> bool:
    """The start of a line a crash cut short: a whole record ends with ``}``."""
    return not line.rstrip().endswith("}")


def read_jsonl(path: Path, skip_corrupt: bool, *, skip_torn: bool = False, warn: bool = True) -> Iterator[tuple[int, Any]]:
    """(line number, object) of each line. A line that does not parse (or is not UTF-8) raises
    `CorruptRecordError`, unless `skip_corrupt`; with `skip_torn`, a torn line (the start of a line a
    crash cut short: it cannot end with ``}``) is skipped too. Every skipped line is warned about, by
    file and line, unless not `warn` (a server showing what it can read: silencing warnings with
    `warnings.catch_warnings` instead changes the filters of every thread of the process)."""
    for n, (line, problem) in enumerate(_text_lines(path), start=1):
        if not line.strip():
            continue
        if problem is None:
            try:  # groupwise.core.readers' parser: a line nested past reading is a problem, not a RecursionError
                yield n, parse_json(line, allow_nan=True)
                continue
            except JSONProblem as exc:
                problem = str(exc)
        torn = _torn(line)
        if not (skip_corrupt or (skip_torn and torn)):
            raise CorruptRecordError(str(path), n, problem)
        what = "a line cut short by a crash mid-write" if torn else problem
        if warn:
            warnings.warn(f"{path}:{n}: skipped ({what})", GroupwiseWarning, stacklevel=3)


def load_history(run_dir: str | os.PathLike, *, skip_corrupt: bool = False, warn: bool = True) -> list[Row]:
    """The rows of `run_dir/history.jsonl` in the order they were written ([] when there is none).

    A torn line (a crash mid-append) is skipped with a warning naming the file and line; any other
    corrupt line raises `CorruptRecordError`, unless `skip_corrupt` (then it is skipped, with a warning).
    Not `warn`: skipped without one (`read_jsonl`).
    """
    path = Path(run_dir) / HISTORY_FILE
    if not path.exists():
        return []
    rows = []
    for n, obj in read_jsonl(path, skip_corrupt, skip_torn=True, warn=warn):
        if not _is_row(obj):
            if not skip_corrupt:
                raise CorruptRecordError(str(path), n, NOT_A_ROW)
            if warn:
                warnings.warn(f"{path}:{n}: skipped ({NOT_A_ROW})", GroupwiseWarning, stacklevel=2)
            continue
        rows.append(obj)
    return rows


NOT_A_ROW = "a history row must be an object with 'step' (an int >= 0) and 'split' (text)"


def _is_row(obj: Any) -> bool:
    """A row every reader can index: an object whose step is an int >= 0 and whose split is text (a hand
    edit that made the step "5" or 1.5 is skipped with the others, by file and line)."""
    if not isinstance(obj, dict):
        return False
    step = obj.get("step")
    return isinstance(step, int) and not isinstance(step, bool) and step >= 0 and isinstance(obj.get("split"), str)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    """An exclusive lock for a write (a file beside the data: the data file itself is replaced by
    rewrites, and a lock on a replaced inode would guard nothing)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _append_line(path: Path, line: str) -> os.stat_result:
    try:
        return _append(path, line)
    except OSError as exc:  # a torn line a full disk leaves is one the readers skip
        raise _unwritable(path, exc) from None


def _append(path: Path, line: str) -> os.stat_result:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        prefix = ""
        if size:
            # A crash mid-append leaves a line without its newline: start ours on a fresh line.
            last = os.pread(fd, 1, size - 1)
            prefix = "" if last == b"\n" else "\n"
        os.write(fd, (prefix + line + "\n").encode("utf-8"))
        os.fsync(fd)
        return os.fstat(fd)
    finally:
        os.close(fd)


def _signature(st: os.stat_result | None) -> tuple[int, int, int] | None:
    return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


# One thread does every history write of the process, in submission order (module doc). Not the
# compute thread: an fsync there would stall the engines' decoding.
_writer: concurrent.futures.ThreadPoolExecutor | None = None
_writer_lock = threading.Lock()


def _writer_thread() -> concurrent.futures.ThreadPoolExecutor:
    global _writer
    with _writer_lock:
        if _writer is None:
            _writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="groupwise-history")
        return _writer


# ------------------------------------------------------------------------------------ the mirror


class RunHistory(Sequence[Row]):
    """The rows of one run's ``history.jsonl``, in memory, and the one writer of that file (module doc).

    A `Sequence` of row dicts in written order (what `load_history` returns), so every reader of a
    history list (`groupwise.runs.series`, the detectors, the stopping rules) reads it as it is; plus
    `rows` and `events`, which answer from an index by split instead of a scan, and the typed views
    (`groupwise.runs.curves`): `train_curve`, `validations` (with their intervals), `alerts`, `baselines`.
    Rows are shared, not copied: readers must not modify them. Thread-safe.

    Obtain it with ``RunHistory.of(run_dir)`` (or ``store.run_history``): one per folder per process."""

    _open: "weakref.WeakValueDictionary[str, RunHistory]" = weakref.WeakValueDictionary()
    _open_lock = threading.Lock()

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / HISTORY_FILE
        self._lock = threading.RLock()
        self._lines: list[str] = []  # every line of the file, torn and corrupt ones too (a rewrite keeps them)
        self._rows: list[Row] = []  # the parsed rows, in line order
        self._row_line: list[int] = []  # self._lines index of each row
        self._by_key: dict[tuple[str, ...], int] = {}  # key -> index into self._rows
        self._by_split: dict[str, list[int]] = {}  # split -> indices into self._rows, in written order
        self._signature: tuple[int, int, int] | None | bool = False  # False: never loaded
        self._pending = 0  # writes submitted to the writer thread and not yet done
        # A write failed since the last load: memory holds a row the file lacks, so no later write's
        # signature may pass for the file's; the next read once no write is pending reloads it.
        self._failed = False
        self.loads = 0  # how many times the file was parsed (tests hold the loop to one per run)
        self.writes = 0  # how many lines were appended, and how many rewrites (`rewrites`)
        self.rewrites = 0
        self._listeners: list[Any] = []  # called with each row written (groupwise.runs.wandb_log's reporter)

    @classmethod
    def of(cls, run_dir: str | os.PathLike) -> "RunHistory":
        """The process's `RunHistory` of `run_dir` (created on first use, kept while anyone holds it)."""
        key = os.path.realpath(run_dir)
        with cls._open_lock:
            history = cls._open.get(key)
            if history is None:
                history = cls._open[key] = cls(run_dir)
            return history

    def __repr__(self) -> str:
        return f"RunHistory({str(self.path)!r}, rows={len(self)})"

    # -- reading -----------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Load the file the first time, and again when someone else changed it (module doc)."""
        if self._pending:
            return  # our own writes are ahead of the file: memory is the truth
        signature = _signature(_stat(self.path))
        if signature != self._signature:
            self._load(signature)

    def _load(self, signature: tuple[int, int, int] | None) -> None:
        self._lines, self._rows, self._row_line, self._by_key, self._by_split = [], [], [], {}, {}
        self._failed = False
        lines = list(_text_lines(self.path)) if signature is not None else []
        if signature is not None:
            self.loads += 1
        self._lines = [line for line, _ in lines]  # a line that is not UTF-8 is kept with U+FFFD: rewrites write text
        for n, (line, problem) in enumerate(lines):
            if not line.strip():
                continue
            if problem is None:
                try:
                    obj = parse_json(line, allow_nan=True)
                except JSONProblem as exc:
                    problem = str(exc)
            if problem is not None:
                what = "a line cut short by a crash mid-write" if _torn(line) else problem
                warnings.warn(f"{self.path}:{n + 1}: skipped ({what})", GroupwiseWarning, stacklevel=4)
                continue
            if not _is_row(obj):
                warnings.warn(f"{self.path}:{n + 1}: skipped ({NOT_A_ROW})", GroupwiseWarning, stacklevel=4)
                continue
            self._index(obj, n)
        self._signature = signature

    def _index(self, row: Row, line: int) -> None:
        key = history_key(row)
        at = self._by_key.get(key)
        if at is not None:  # a file written before appends were idempotent: the last row wins
            self._rows[at], self._row_line[at] = row, line
            return
        self._by_key[key] = len(self._rows)
        self._by_split.setdefault(row["split"], []).append(len(self._rows))
        self._rows.append(row)
        self._row_line.append(line)

    def __len__(self) -> int:
        with self._lock:
            self._sync()
            return len(self._rows)

    @overload
    def __getitem__(self, i: int) -> Row: ...

    @overload
    def __getitem__(self, i: slice) -> list[Row]: ...

    def __getitem__(self, i: int | slice) -> Row | list[Row]:
        with self._lock:
            self._sync()
            return self._rows[i]

    def __iter__(self) -> Iterator[Row]:
        return iter(self.snapshot())

    def snapshot(self) -> list[Row]:
        """The rows now, as a list (later appends do not change it)."""
        with self._lock:
            self._sync()
            return list(self._rows)

    def events(self, split: str) -> list[Row]:
        """Every row of `split`, in written order."""
        with self._lock:
            self._sync()
            return [self._rows[i] for i in self._by_split.get(split, ())]

    def rows(self, split: str) -> list[Row]:
        """The rows of `split`, one per step (the last written wins), by step."""
        by_step = {r["step"]: r for r in self.events(split) if isinstance(r.get("step"), int)}
        return [by_step[s] for s in sorted(by_step)]

    # -- typed views (groupwise.runs.curves) --------------------------------------------------------------
    def curve(self, split: str, key: str, *, up_to: int | None = None, confidence: float = DEFAULT_CONFIDENCE) -> list[Point]:
        """`key` of `split` by step, each point with its confidence interval where known."""
        return points_of(self.rows(split), split, key, up_to=up_to, confidence=confidence)

    def train_curve(self, key: str = "reward", *, up_to: int | None = None, confidence: float = DEFAULT_CONFIDENCE) -> list[Point]:
        """The train rows' `key` by step (the mean reward with its interval from its spread and count)."""
        return self.curve("train", key, up_to=up_to, confidence=confidence)

    def validations(self, metric: str, *, up_to: int | None = None) -> list[Point]:
        """Every validation's `metric` by step, with the interval it was logged with."""
        return self.curve("val", metric, up_to=up_to)

    def alerts(self) -> list[AlertRecord]:
        """Every alert, in the order raised."""
        return [AlertRecord.from_row(r) for r in self.events("alert")]

    def baselines(self, metric: str) -> dict[str, Point]:
        """{baseline name: its validation `metric` with its interval}."""
        return baseline_points(self.events("baseline"), metric)

    def has(self, row: Row) -> bool:
        """Whether a row with `row`'s key (`history_key`) is there."""
        with self._lock:
            self._sync()
            return history_key(row) in self._by_key

    def row_with_key(self, row: Row) -> Row | None:
        """A copy of the row with `row`'s key (`history_key`), or None."""
        with self._lock:
            self._sync()
            at = self._by_key.get(history_key(row))
            return None if at is None else dict(self._rows[at])

    # -- writing -----------------------------------------------------------------------------------
    def append(self, row: Row, *, if_missing: bool = False) -> bool:
        """Add `row` (or replace the row with its key; with `if_missing`, leave that one) and return once
        it is on disk. Returns whether the history changed. For async code: `write`."""
        changed, job = self._enter(row, if_missing)
        if job is not None:
            job.result()
        self._tell(row, changed)
        return changed

    async def write(self, row: Row, *, if_missing: bool = False) -> bool:
        """`append` for async code: the row is in memory at once, the event loop awaits its disk write."""
        changed, job = self._enter(row, if_missing)
        if job is not None:
            await asyncio.wrap_future(job)
        self._tell(row, changed)
        return changed

    def add_listener(self, listener: Any) -> None:
        """Call `listener(row)` with every row written from now on, once it is on disk (a copy)."""
        with self._lock:
            if listener not in self._listeners:
                self._listeners.append(listener)

    def remove_listener(self, listener: Any) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _tell(self, row: Row, changed: bool) -> None:
        if not changed:
            return
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(dict(row))

    def _enter(self, row: Row, if_missing: bool) -> tuple[bool, concurrent.futures.Future | None]:
        """Put `row` in memory and queue its disk write, in one critical section: the writer thread
        writes in the order rows entered memory."""
        if not isinstance(row, dict) or "step" not in row or "split" not in row:
            got = f"keys {sorted(row)}" if isinstance(row, dict) else type(row).__name__
            raise StoreError(f"a history row needs 'step' and 'split'; got {got}")
        bad = non_finite_field(row)
        if bad is not None:
            raise StoreError(f"history row of step {row['step']!r}, split {row['split']!r}: {bad[0]} is {bad[1]}; a "
                             "history row holds finite numbers only (JSON has no NaN or Infinity, and every reader "
                             "would guess what one meant). Nothing was written. Write None for a value that does "
                             "not exist; a metric of groupwise's own that is not finite is a bug to report")
        line = dumps(row)
        with self._lock:
            self._sync()
            at = self._by_key.get(history_key(row))
            if at is not None and if_missing:
                return False, None
            if at is None:
                self._lines.append(line + "\n")
                self._index(row, len(self._lines) - 1)
                job = (self._write_line, line)
            else:
                self._rows[at] = row
                self._lines[self._row_line[at]] = line + "\n"
                job = (self._rewrite, "".join(x if x.endswith("\n") else x + "\n" for x in self._lines))
            self._pending += 1
            return True, _writer_thread().submit(self._run, *job)

    def _run(self, fn: Any, arg: str) -> None:
        try:
            with _locked(self.run_dir / ".history.lock"):
                st = fn(arg)
        except BaseException:
            with self._lock:
                self._pending -= 1
                self._failed = True
                self._signature = False  # the file is not what memory holds: reload it at the next read
            raise
        with self._lock:
            self._pending -= 1
            # after a failed write, a later one that succeeded leaves a file memory still differs from
            self._signature = False if self._failed else _signature(st)

    def _write_line(self, line: str) -> os.stat_result:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.writes += 1
        return _append_line(self.path, line)

    def _rewrite(self, text: str) -> os.stat_result | None:
        self.rewrites += 1
        atomic_write_text(self.path, text)
        return _stat(self.path)
