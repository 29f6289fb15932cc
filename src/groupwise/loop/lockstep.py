"""Runs of one `gw.fit([...])` call start each step's rollouts together (`LoopConfig.lockstep`).

Why. Runs on one backend share one engine, and one thread steps it and runs every update (compute.py).
Free-running, the runs drift apart: each run's update stalls the others in the middle of their rollouts,
and their rollouts then decode in several smaller batches instead of one. A decode step costs about the
same for 64 rows as for 256 on a GPU, so the drift costs decode steps; four runs of a 0.5B model on one
H100 trained 1.37x the tokens per second of four runs alone when free-running, 1.64x in lockstep.

How. Each synchronous run that takes part is a member; before gathering a step's batch it `arrive`s and
waits until every member still training has arrived (a barrier whose size shrinks as runs end). A run
that stops, fails or finishes training `leave`s, so no run ever waits for one that will not come back.
Runs with `max_steps_off_policy > 0` are not members: their gathers are already ahead of their updates,
and starting them together while the last step's updates go on did not pay on a GPU: the updates and the
decoding beside them slowed each other as much as the overlap saved (docs/benchmarks.md).

Across processes. Runs whose drivers are processes of their own, on one worker that another backend
shares (`LocalBackend(join=...)`, backend/sharing.py), meet at the same kind of barrier held by that
worker: the loop takes it from the backend (`Backend.lockstep_member`) when no sweep of this process gave one.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass
from typing import Any

__all__ = ["Lockstep", "Member", "current", "takes_part"]


@dataclass(frozen=True)
class Member:
    """One run's place in a `Lockstep`: what its loop calls."""

    gate: Lockstep
    name: str

    async def arrive(self) -> None:
        await self.gate.arrive(self.name)

    async def leave(self) -> None:
        await self.gate.leave(self.name)


_MEMBER: contextvars.ContextVar[Member | None] = contextvars.ContextVar("groupwise_lockstep", default=None)


class Lockstep:
    """A barrier over the member runs still training (module doc)."""

    def __init__(self, members: list[str]) -> None:
        self.live = set(members)
        self.arrived: set[str] = set()
        self.round = 0
        self.cv = asyncio.Condition()

    def enter(self, member: str) -> None:
        """Make the current task (a run's) this barrier's `member`: `current()` finds it there."""
        _MEMBER.set(Member(self, member))

    async def arrive(self, member: str) -> None:
        """Wait until every live member has arrived (this round), then go on together. A member not yet
        live joins here: the runs of drivers in other processes on one shared worker (backend/sharing.py)
        start at their own moments, and wait for each other from their first arrival on."""
        async with self.cv:
            self.live.add(member)
            self.arrived.add(member)
            this_round = self.round
            self._release_if_complete()
            await self.cv.wait_for(lambda: self.round != this_round)

    async def expect(self, member: str) -> None:
        """`member` takes part from now, before its first arrival: the others wait for it from their next
        arrival on. Drivers in other processes that start at their own moments (a sweep's processes: the
        train job) say so before they start, so that no run's first step goes alone."""
        async with self.cv:
            self.live.add(member)

    async def leave(self, member: str) -> None:
        """`member` trains no more: the others stop waiting for it (idempotent)."""
        async with self.cv:
            self.live.discard(member)
            self.arrived.discard(member)
            self._release_if_complete()

    def _release_if_complete(self) -> None:
        if self.arrived and self.arrived >= self.live:
            self.arrived.clear()
            self.round += 1
            self.cv.notify_all()


def takes_part(config: Any) -> bool:
    """Whether a run of this `LoopConfig` waits for the others (module doc: a pipelined run never does)."""
    return config.lockstep and config.max_steps_off_policy == 0


def current() -> Member | None:
    """The place in a barrier of the run whose task this is; None outside a lockstep sweep."""
    return _MEMBER.get()
