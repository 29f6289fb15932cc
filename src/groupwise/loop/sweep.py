"""`gw.fit` of several runs at once: seeds, learning rates, rewards or judges swept in one process.

    summaries = await gw.fit([model_a, model_b], rollout, train, val_scenarios=val, validate=check,
                             config=[gw.LoopConfig(learning_rate=5e-4), gw.LoopConfig(learning_rate=1e-3)])

or, when the runs differ in more than their config (each seed its own training scenarios)::

    summaries = await gw.fit_runs([gw.FitRun(model, rollout, train_of[seed], val_scenarios=val, config=...)
                                   for seed, model in ...])

Each run is one `fit` call in a task of its own: its rollouts, steps, validations, stopping rules,
detectors, history, checkpoints and resume are its own. Registered on one backend with the same base
model, the runs share the engine's batches and the base weights (backend/replica.py), and each trains as
it would alone (tests/backend/test_many_runs.py). A run that fails (a rollout that raises past its
exception budget, an update that diverges: NonFiniteError, ...) ends alone and its result is the
exception; a run a detector or a stopping rule stops ends with its summary; the others go on either way.
Cancelling the call cancels every run (a step under way still ends at its checkpoint:
backend/driver.py's `run_to_end`).

Every line the loop logs (``groupwise.loop``: the step lines, alerts, the stop) starts with its run's
name, ``[2048-s1] step 3/8 · reward ...``, so one terminal can follow four runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from groupwise.config import LoopConfig
from groupwise.errors import ConfigError
from groupwise.loop.fit import FitSummary, Rollout, ScoreGroup, Validate
from groupwise.loop.fit import fit as fit_one
from groupwise.loop.lockstep import Lockstep, takes_part
from groupwise.runs.run_id import RunId

__all__ = ["FitRun", "fit", "fit_runs"]

_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("groupwise_fit_run", default=None)
_LOGGERS = ("groupwise.loop",)


@dataclass
class FitRun:
    """One run of `fit_runs`: `fit`'s arguments (its docstring says what each is)."""

    model: Any
    rollout: Rollout
    train_scenarios: Sequence[Any]
    val_scenarios: Sequence[Any] | None = None
    test_scenarios: Sequence[Any] | None = None
    score_group: ScoreGroup | None = None
    validate: Validate | None = None
    baselines: Sequence[Any] = field(default_factory=tuple)
    config: LoopConfig | None = None
    teacher: str | None = None


class _RunName(logging.Filter):
    """Prefix each record logged inside a run's task with ``[run name]``."""

    def filter(self, record: logging.LogRecord) -> bool:
        name = _RUN.get()
        if name is not None and not getattr(record, "_groupwise_run", False):
            record.msg = f"[{name.replace('%', '%%')}] {record.msg}"
            record._groupwise_run = True  # type: ignore[attr-defined]
        return True


_filter = _RunName()
_users = 0


@contextlib.contextmanager
def _run_names() -> Iterator[None]:
    global _users
    if _users == 0:
        for name in _LOGGERS:
            logging.getLogger(name).addFilter(_filter)
    _users += 1
    try:
        yield
    finally:
        _users -= 1
        if _users == 0:
            for name in _LOGGERS:
                logging.getLogger(name).removeFilter(_filter)


def _labels(models: list[Any]) -> list[str]:
    """Each run's name in the logs and the lockstep gate: its model's name where no other run's model has
    it, else its run's qualified name (``<project>/<run>``, groupwise/runs/run_id.py: a sweep across projects),
    else its run folder. Two models of one run folder get one label, which `fit_runs` refuses."""
    def identity(model: Any) -> RunId | str:
        if all(hasattr(model, a) for a in ("base_path", "project", "storage_name")):
            return RunId.of(model)
        return str(getattr(model, "name", None))

    names = [str(getattr(m, "name", None)) for m in models]
    ids = [identity(m) for m in models]
    keys = [i.key if isinstance(i, RunId) else i for i in ids]
    return [n if names.count(n) == 1 else k if keys.count(k) == 1 else str(i) for n, i, k in zip(names, ids, keys)]


def _in_lockstep(run: FitRun) -> bool:
    return takes_part(run.config if run.config is not None else LoopConfig())


async def _named(name: str, run: FitRun, gate: Lockstep | None) -> FitSummary:
    _RUN.set(name)  # this task's own context: the other runs' lines keep their names
    if gate is not None:
        gate.enter(name)
    try:
        return await fit_one(run.model, run.rollout, run.train_scenarios, val_scenarios=run.val_scenarios,
                             test_scenarios=run.test_scenarios, score_group=run.score_group, validate=run.validate,
                             baselines=run.baselines, config=run.config, teacher=run.teacher)
    finally:
        if gate is not None:  # a run that ended before its loop (a failed start, max_steps=0) leaves too
            await gate.leave(name)


async def fit_runs(runs: Sequence[FitRun]) -> list[FitSummary | BaseException]:
    """Train every run at once (module doc); their results in order: a `FitSummary`, or the exception that
    ended the run."""
    runs = list(runs)
    problems = [f"runs[{i}] is {type(r).__name__}; expected a gw.FitRun" for i, r in enumerate(runs)
                if not isinstance(r, FitRun)]
    if not runs:
        problems.append("no runs: pass at least one gw.FitRun")
    labels = _labels([r.model for r in runs if isinstance(r, FitRun)])
    twice = sorted({n for n in labels if labels.count(n) > 1})
    if twice:
        problems.append(f"run(s) {twice} appear in several runs; each run needs a model of its own")
    if problems:
        raise ConfigError(problems, what="fit_runs() arguments")
    members = [label for r, label in zip(runs, labels) if _in_lockstep(r)]
    gate = Lockstep(members) if len(members) > 1 else None
    with _run_names():
        tasks = [asyncio.create_task(_named(label, r, gate if _in_lockstep(r) else None))
                 for r, label in zip(runs, labels)]
        try:
            return list(await asyncio.gather(*tasks, return_exceptions=True))
        finally:
            for t in tasks:  # the call itself was cancelled: so is every run
                t.cancel()


async def fit_many(models: Sequence[Any], rollout: Rollout, train_scenarios: Sequence[Any], *,
                   config: LoopConfig | Sequence[LoopConfig] | None = None, **kwargs: Any
                   ) -> list[FitSummary | BaseException]:
    """`fit`'s form for several models: one `config` for all or one per model, the other arguments shared."""
    models = list(models)
    configs = list(config) if isinstance(config, (list, tuple)) else [config] * len(models)
    if len(configs) != len(models):
        raise ConfigError([f"{len(configs)} configs for {len(models)} models: give one LoopConfig, or one per model"],
                          what="fit() arguments")
    return await fit_runs([FitRun(m, rollout, train_scenarios, config=c, **kwargs) for m, c in zip(models, configs)])


@functools.wraps(fit_one)
async def fit(model: Any, rollout: Rollout, train_scenarios: Sequence[Any], **kwargs: Any) -> Any:
    if isinstance(model, (list, tuple)):
        return await fit_many(model, rollout, train_scenarios, **kwargs)
    return await fit_one(model, rollout, train_scenarios, **kwargs)


fit.__doc__ = f"""{fit_one.__doc__}
    Several runs at once (`gw.fit` is this module's `fit`): `model` a list of models and `config` one
    `LoopConfig` for all or a list, one per model; returns their results in order, each a `FitSummary`
    or the exception that ended that run alone (`gw.fit_runs` when the runs differ in more than their
    config; loop/sweep.py).
    """
