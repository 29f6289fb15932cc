"""A request's schema work, off the event loop and off the compute thread, under a time budget.

Checking tool and response schemas against JSON Schema's meta-schema (jsonschema, pure Python) and
compiling the grammar a request asks for (llguidance) both grow with the schema. On the event loop
they stalled every caller (``GET /v1/models`` waited 25 s behind 2000 tools); on the compute thread,
every generation. Here they run on a small pool of their own threads, only for requests that have
schemas, so a plain request never waits for them. request_limits.py bounds the work before it
starts; the budget is the last line: a request whose work runs longer than it (timed from when a
worker takes it, not while it queues) gets a 400, and the worker finishes the bounded work and
drops the result. llguidance releases the GIL while it compiles; jsonschema does not, but it yields
it every few milliseconds like any Python thread, so the event loop keeps answering.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Any, Callable

from groupwise.errors import GroupwiseError

__all__ = ["DEFAULT_PREPARE_BUDGET_S", "PREPARE_WORKERS", "OverBudget", "Preparer", "SchemaProblem",
           "check_json_schema", "check_request_schemas"]

log = logging.getLogger("groupwise.serve")

DEFAULT_PREPARE_BUDGET_S = 10.0  # honest schemas take milliseconds; the bounds keep the worst near 1 s
PREPARE_WORKERS = 2


class OverBudget(GroupwiseError):
    """The schema work of a request ran longer than the budget."""


class SchemaProblem(GroupwiseError, ValueError):
    """A schema of the request is not valid JSON Schema; `param` names where it is."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


class Preparer:
    """The pool that runs schema work (module doc). One per app."""

    def __init__(self, budget_s: float = DEFAULT_PREPARE_BUDGET_S, workers: int = PREPARE_WORKERS):
        self.budget_s = budget_s
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="groupwise-prepare")

    async def run(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        """fn(*args) on a worker; OverBudget if it runs past the budget once started."""
        loop = asyncio.get_running_loop()
        started = asyncio.Event()

        def job() -> Any:
            loop.call_soon_threadsafe(started.set)
            t0 = time.monotonic()
            try:
                return fn(*args)
            finally:
                spent = time.monotonic() - t0
                if spent > self.budget_s:
                    log.warning("a request's schema work took %.1f s, over the budget of %.1f s; it was refused",
                                spent, self.budget_s)

        future = self._pool.submit(job)
        waiter = asyncio.wrap_future(future)
        try:
            await started.wait()  # queued behind other requests' schema work: not counted
            return await asyncio.wait_for(asyncio.shield(waiter), self.budget_s)
        except TimeoutError:
            waiter.cancel()  # the worker ends the (bounded) work on its own; nobody reads the result
            raise OverBudget from None
        except asyncio.CancelledError:  # the client went away: drop the job if it has not started
            future.cancel()
            raise

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def check_json_schema(schema: dict[str, Any], what: str) -> None:
    """Refuse a schema that is not valid JSON Schema (jsonschema's meta-schema check)."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise ValueError(f"{what} is not a valid JSON schema{f' at {where}' if where else ''}: {exc.message}") from None


def check_request_schemas(tools: list[dict] | None, response_format: dict | None) -> None:
    """Every tool's parameters and the response_format's schema checked as JSON Schema (whenever
    tools are given, not only when a call is forced); SchemaProblem names the first bad one."""
    for i, tool in enumerate(tools or []):
        params = tool.get("function", {}).get("parameters")
        if params is not None:
            param = f"tools[{i}].function.parameters"
            try:
                check_json_schema(params, "parameters")
            except ValueError as exc:
                raise SchemaProblem(f"invalid request: {param}: {exc}", param) from None
    spec = (response_format or {}).get("json_schema") or {}
    if isinstance(spec.get("schema"), dict):
        param = "response_format.json_schema.schema"
        try:
            check_json_schema(spec["schema"], param)
        except ValueError as exc:
            raise SchemaProblem(f"invalid request: {exc}", param) from None
