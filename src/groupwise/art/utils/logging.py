"""ART's print helpers (`art.utils.logging`): one timestamped, labelled line each, which its MCP
notebook prints its progress with. Coloured on a terminal only, so a log file holds no escape codes."""

from __future__ import annotations

import sys
import time

__all__ = ["dim", "err", "info", "ok", "step", "warn"]

_COLOURS = {"INFO": "34", "STEP": "36", "OK": "32", "WARN": "33", "ERR": "31"}


def _line(label: str, msg: object) -> None:
    shown = f"\x1b[{_COLOURS[label]}m{label}\x1b[0m" if sys.stdout.isatty() else label
    print(f"[{time.strftime('%H:%M:%S')}] {shown}{' ' * (6 - len(label))}{msg}")


def info(msg: object) -> None:
    _line("INFO", msg)


def step(msg: object) -> None:
    _line("STEP", msg)


def ok(msg: object) -> None:
    _line("OK", msg)


def warn(msg: object) -> None:
    _line("WARN", msg)


def err(msg: object) -> None:
    _line("ERR", msg)


def dim(msg: object) -> None:
    print(f"\x1b[2m{msg}\x1b[0m" if sys.stdout.isatty() else msg)
