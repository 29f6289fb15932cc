"""The time a rollout's sampler could not serve it, which the rollout's timeout does not count.

`rollout_timeout_s` ends rollouts that hang, not rollouts that wait. An engine that several runs share
(a sweep, or an asynchronous loop) is paused while a run updates, minutes on a CPU, and queues
requests past its batch when many runs test at once; every rollout sampling from it waits through
both without being at fault. Counted against a 10-minute timeout, a sweep of several runs on a
loaded 2-core machine cancelled healthy test rollouts after every run had trained, and the runs
ended as failed.

So engines in this process say when they stall (`set_stalled`): paused with requests in flight, or
holding a request that no free slot can take. `STALLS.seconds()` is the time during which at least
one engine was stalled (the union of their stalls, so two engines stalled at once count once), and
the gather's clock is wall time less it. A rollout hung in its own code still times out: its clock
runs whenever the engines serve, and a gather cannot finish while it hangs, so the engines drain.
A sampler in another process (an HTTP server, a Ray worker) does not report here; its rollouts keep
the wall clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["STALLS", "StallClock"]


class StallClock:
    """Seconds during which at least one source was stalled; thread-safe (engines report from their
    compute thread, the event loop reads)."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._stalled: set[int] = set()  # id() of the sources stalled now
        self._total = 0.0  # closed stall intervals
        self._since = 0.0  # start of the open one, while any source is stalled

    def set_stalled(self, source: object, stalled: bool) -> None:
        """Record that `source` is (or is no longer) stalled. A source must say False before it goes
        (its id may be reused)."""
        key = id(source)
        with self._lock:
            was = bool(self._stalled)
            if stalled:
                self._stalled.add(key)
            else:
                self._stalled.discard(key)
            if was != bool(self._stalled):
                now = self._now()
                if was:
                    self._total += now - self._since
                else:
                    self._since = now

    def seconds(self) -> float:
        with self._lock:
            return self._total + (self._now() - self._since if self._stalled else 0.0)

    def rollout_time(self) -> float:
        """The clock a rollout's timeout reads: monotonic seconds that stand still while a sampler stalls."""
        return self._now() - self.seconds()


STALLS = StallClock()  # this process's engines report here; rollout/gather.py reads it
