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
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """A folder of ``<key[:2]>/<key>.json`` files holding ``{"content": ..., "usage": {...}}``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).expanduser()

    def _file(self, key: str) -> Path:
        return self.path / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        f = self._file(key)
        try:
            return json.loads(f.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError):
            return None  # a damaged entry is a miss; the fresh answer overwrites it

    def put(self, key: str, value: dict[str, Any]) -> None:
        f = self._file(key)
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(value, out, ensure_ascii=False)
            os.replace(tmp, f)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def __len__(self) -> int:
        return sum(1 for _ in self.path.glob("*/*.json")) if self.path.exists() else 0
