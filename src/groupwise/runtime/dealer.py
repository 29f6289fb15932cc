"""One turn of the I/O thread of a ZeroMQ DEALER that callers on other threads send through.

ZeroMQ sockets are not thread-safe, so a client that many threads use (an engine core's frontend,
inference/engine_client.py; a driver of a shared worker, backend/sharing.py) gives its socket to one I/O
thread: callers queue their messages under a lock and write a byte to a pipe that the thread polls beside
the socket. Each wake-up, the thread empties the pipe, sends what was queued, and reads what arrived.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any

__all__ = ["exchange"]


def exchange(sock: Any, wake_r: int, lock: threading.Lock, outbox: deque) -> list[bytes]:
    """Clear the wake pipe `wake_r`, send `outbox`'s messages (queued under `lock`) on `sock`, and return
    every message that has arrived, without waiting."""
    import zmq

    with lock:
        try:
            os.read(wake_r, 4096)
        except BlockingIOError:
            pass
        out = list(outbox)
        outbox.clear()
    for data in out:
        sock.send(data)
    received = []
    while True:
        try:
            received.append(sock.recv(zmq.NOBLOCK))
        except zmq.Again:
            return received
