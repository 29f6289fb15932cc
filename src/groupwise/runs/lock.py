"""The writer lock of a run folder: one process trains a run at a time."""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from groupwise.errors import RunFolderError, RunLockedError

try:  # POSIX only; elsewhere there is no lock (RunLock's doc)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["RunLock", "RunLocks"]


class RunLock:
    """An exclusive lock on a run folder for the process that trains it (`LocalBackend.register` takes
    it, `close` releases it): two processes training one run would each append steps the other never
    sees, and both would report success.

    It is a `fcntl.flock` on ``<run_dir>/.writer.lock``, taken without waiting, so a second writer fails
    at once with `RunLockedError` naming the holder (pid, host, start time, written into the file). The
    kernel drops a flock when its process exits, however it exits (SIGKILL, a crash, the OOM killer):
    the lock of a killed run is never stale, and the next writer simply takes it. The file is never
    deleted (deleting it would let two processes lock two different files of the same name). Two
    backends in one process lock each other out too (each opens the file anew). Advisory, POSIX only:
    readers (`groupwise inspect`, `report`) never take it; where flock is missing (Windows), or does not
    reach across hosts (some network filesystems), there is no lock.
    """

    FILE = ".writer.lock"

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / self.FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> "RunLock":
        if self._fd is not None or fcntl is None:
            return self
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # the first write of a run: say where it cannot write, not mkdir's traceback
            raise self._unwritable(exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: another open file (another process, or backend) holds it
            holder = self._holder(fd)
            os.close(fd)
            raise RunLockedError(
                f"run folder {str(self.path.parent)!r} is being written by {holder}: two "
                "writers would lose each other's steps. Stop that process (or close its backend) first, or "
                f"train under another model name or base_path. (The lock, {self.FILE}, is released when its "
                "process exits, even killed.)"
            ) from None
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info) + "\n").encode("utf-8"), 0)
        except OSError as exc:  # a full disk takes the open but not the bytes
            os.close(fd)
            raise self._unwritable(exc) from None
        self._fd = fd
        return self

    def _unwritable(self, exc: OSError) -> RunFolderError:
        return RunFolderError(
            f"cannot write the run folder {str(self.path.parent)!r} ({exc.strerror or exc}): choose a run store "
            "on a writable disk with room (--path on the command line, base_path= in Python)")

    @staticmethod
    def _holder(fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
            who = f"pid {info['pid']} on host {info['host']}, since {info['started_at']}"
        except (ValueError, KeyError, TypeError, OSError):
            return "another process, starting up (its details are not written yet)"
        if info["pid"] == os.getpid() and info["host"] == socket.gethostname():
            return f"another backend of this same process ({who})"
        return f"another process ({who})"

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor of the open file drops the flock

    def __del__(self) -> None:  # a backend dropped without close() still lets the folder go
        self.release()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


class RunLocks:
    """The writer locks a backend holds: one per registered run, taken before the run loads anything
    and held until the backend closes (`release_all`), so another process may train the runs then."""

    def __init__(self) -> None:
        self._held: dict[str, RunLock] = {}  # model name -> its run folder's lock

    @contextmanager
    def holding(self, name: str, run_dir: str | os.PathLike) -> Iterator[RunLock]:
        """Take the lock of `run_dir` for model `name`: kept when the block succeeds, released again when
        it raises (a registration that failed leaves the folder free)."""
        self._held[name] = lock = RunLock(run_dir).acquire()
        try:
            yield lock
        except BaseException:
            self._held.pop(name).release()
            raise

    def release(self, name: str) -> None:
        """Release the lock of model `name` (a run that left the backend), if held."""
        lock = self._held.pop(name, None)
        if lock is not None:
            lock.release()

    def release_all(self) -> None:
        for lock in self._held.values():
            lock.release()
        self._held.clear()
