"""Waiting for a state that other processes reach (a core, a frontend, a worker), in tests of them."""

from __future__ import annotations

import time


def wait_for(check, what: str, limit_s: float = 60.0):
    """Poll `check` until it returns truthy (a state the processes reach, not a timing being asserted)."""
    deadline = time.monotonic() + limit_s
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"never reached: {what}"
        time.sleep(0.05)
