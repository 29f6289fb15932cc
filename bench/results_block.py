"""Write a bench script's results table into the docs, between its markers, saying where it was measured.

A results table in README.md or docs/benchmarks.md sits between ``<!-- bench:NAME -->`` and
``<!-- /bench:NAME -->``; the script that measures it rewrites only that block (`write_block`), and the
block opens with `provenance`: the command that measured it, the commit of the code it measured (and
whether that code had uncommitted changes), the machine and the date. A table edited by hand would
drift from the code it describes; a table with its commit and machine can be checked by re-running it.

Used by bench/seeds_2048.py; imported from the bench folder (``python bench/<script>.py`` puts it on
the path).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from datetime import date
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"


def write_block(path: Path, name: str, block: str) -> None:
    """Replace what lies between `name`'s markers in `path` with `block` (the markers stay)."""
    begin, end = markers(name)
    text = path.read_text()
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"{path} needs exactly one {begin} ... {end} pair, in that order, where the table goes")
    head, rest = text.split(begin, 1)
    path.write_text(head + begin + "\n" + block.strip("\n") + "\n" + end + rest.split(end, 1)[1])


def read_block(path: Path, name: str) -> str:
    begin, end = markers(name)
    return path.read_text().split(begin, 1)[1].split(end, 1)[0].strip("\n")


def commit(root: Path = ROOT) -> str:
    """The short hash of HEAD, with "+ uncommitted changes" when src/ or bench/ differ from it: the
    table then describes code no commit holds, and says so."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "src", "bench")
    return f"{head} + uncommitted changes" if dirty else head


def machine(device: str = "cpu") -> str:
    """CPU model, the cores this process may use, memory, (on CUDA) the GPU, and torch's version."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    parts = [f"{cpu}, {cores} cores"]
    try:
        kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal"))
        parts.append(f"{kb / 2**20:.0f} GiB")
    except (OSError, StopIteration):
        pass
    if device.startswith("cuda"):
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True).stdout.strip().splitlines()
        parts.append(f"{len(gpu)} x {gpu[0]}" if gpu else "a CUDA device")
    try:
        parts.append(f"torch {metadata.version('torch')}")
    except metadata.PackageNotFoundError:
        pass
    return ", ".join(parts)


def this_command() -> str:
    """How this script was run, as a shell line (relative to the repository when it can be)."""
    script = Path(sys.argv[0]).resolve()
    try:
        shown = str(script.relative_to(ROOT))
    except ValueError:
        shown = str(script)
    return shlex.join(["python", shown, *sys.argv[1:]])


def provenance(*, command: str, commit_id: str, machine_text: str, day: str | None = None) -> str:
    return (f"Measured by `{command}` at commit `{commit_id}` on {machine_text}, "
            f"{day or date.today().isoformat()}.")


MARKER = re.compile(r"<!-- (/?)bench:([\w:-]+) -->")


def blocks(path: Path) -> list[str]:
    """The names of the marked blocks of `path` (each listed once per marker pair)."""
    return [m.group(2) for m in MARKER.finditer(path.read_text()) if not m.group(1)]
