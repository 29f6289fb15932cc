"""Disk cache of judge answers, keyed by the exact request. Off by default (`cache=None`).

Key: SHA-256 of the canonical JSON of everything that determines the answer — endpoint URL, model,
messages, response_format, temperature, max_tokens, extra body. Change any byte (rubric, order,
seed of the shuffle, one trajectory) and it is a different entry. Only answers that parsed and
validated are stored, so a cache never replays a bad answer. One JSON file per entry, written
atomically (temp file + rename); no pickle.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def request_key(request: dict[str, Any]) -> str:
    blob = json.dumps(request, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    # surrogatepass: a trajectory's text may hold a lone surrogate (a model's "\\ud800", parsed), which
    # strict UTF-8 cannot encode; every other text hashes to the key it always had.
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


class JudgeCache:
    """A folder of ``<key[:2]>/<key>.json`` files holding ``{"content": ..., "usage": {...}}``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).expanduser()

    def _file(self, key: str) -> Path:
        return self.path / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The entry of `key`, or None: a missing, damaged or foreign entry (not ``{"content": str, ...}``)
        is a miss, and the fresh answer overwrites it."""
        f = self._file(key)
        try:
            entry = json.loads(f.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError):  # JSONDecodeError, bad UTF-8, Python's JSON limits
            return None
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            return None
        return entry

    def put(self, key: str, value: dict[str, Any]) -> None:
        f = self._file(key)
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(value, out)  # ASCII: a lone surrogate in an answer is written as its escape
            os.replace(tmp, f)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def __len__(self) -> int:
        return sum(1 for _ in self.path.glob("*/*.json")) if self.path.exists() else 0
