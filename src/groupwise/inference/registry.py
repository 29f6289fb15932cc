"""Served model names -> (engine, adapter).

Names follow ART: a trainable model ``name`` is served as ``name@<step>`` for every step whose
adapter is loaded; plain ``name`` means its latest step, and ``name@0`` the base model (no
adapter). Other ids (the base model's own name, adapters served by folder name) are aliases.
Every resolved request carries its canonical ``name@step`` so the response can say which step
produced it (the trainer checks it serves what it trained, ART bug #661).

A backend registers each run under its qualified name (``<project>/<run>``, groupwise/runs/run_id.py) with
the model's own name as a short name: a request may use the short name (``agent``, ``agent@3``) while
no other run here has it, and is answered under the name it asked for; a short name two runs share is
refused naming both runs' qualified names.

A name never silently answers with an older adapter than it means. ``name`` means the latest step
trained, which `add_step` learns before it loads that step's adapter: while the adapter is not served
(its load failed, or the backend dropped it because the engine did not hold the trained weights) a
request for ``name`` is refused, saying which step it would have got and how to ask for it explicitly.
``name@k`` is only ever step k's adapter: a step not trained yet and a step no longer served (unloaded,
or its checkpoint removed by retention) are refused, each saying which it is.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from groupwise.core.adapter_names import served_name, split_served_name
from groupwise.errors import ConfigError, ModelNotFoundError
from groupwise.inference.engine import Engine, EngineError

__all__ = ["CoreRegistry", "ModelRegistry", "Resolved"]


@dataclass(frozen=True)
class Resolved:
    served_as: str  # canonical name: "agent@3", or an alias
    adapter: str | None  # the engine's adapter (the same served name); None = base model
    step: int | None
    follow: str | None = None  # the model whose latest step was asked for (a plain ``name``): partial rollouts


class ModelRegistry:
    """What one engine serves. Thread-safe; the backend adds a step after each training step."""

    def __init__(self, engine: Engine, base_name: str | None = None):
        self.engine = engine
        self._lock = threading.Lock()
        self._steps: dict[str, dict[int, str | None]] = {}
        self._short: dict[str, str] = {}  # a run's qualified name -> the short name requests may use
        self._trained: dict[str, int] = {}  # the latest step add_step was asked to serve: what ``name`` means
        self._aliases: dict[str, str | None] = {}
        self._to_free: list[str] = []  # adapters of dropped steps, freed once no request uses them
        if base_name:
            self._aliases[base_name] = None

    @staticmethod
    def adapter_name(name: str, step: int) -> str:
        """The engine adapter of `step`: its served name (adapter_names.py), so the engine's errors
        name it as users do. peft's own name for it is the engine's slot (adapter_slots.py)."""
        return served_name(name, step)

    def register_model(self, name: str, *, short: str | None = None) -> None:
        """Serve `name` (and `name@0` = the base model) before any step is trained; `short` is the name
        requests may use for it too while no other model here has that short name (module doc)."""
        for part in (name.rpartition("/")[2], short or ""):
            if "@" in part:
                raise ConfigError(f"model name {part!r} must not contain '@' (it separates the step)",
                                  what="model name")
        with self._lock:
            self._steps.setdefault(name, {0: None})
            if short is not None and short != name:
                self._short[name] = short

    def unregister_model(self, name: str) -> None:
        """Stop serving `name` at all (a run that ended on a shared engine); its adapters are freed as in
        `remove_step`."""
        with self._lock:
            self._short.pop(name, None)
            self._trained.pop(name, None)
            steps = self._steps.pop(name, {})
            self._to_free.extend(a for a in steps.values() if a is not None)
        self._free_unused()

    def add_step(self, name: str, step: int, adapter_path: str | None, *, weights: dict[str, Any] | None = None,
                 config: Any = None) -> str:
        """Load the adapter of `step` (its folder, or its `weights` and peft `config`: Engine.add_adapter)
        and serve it as `name@step` (and as `name` if it is the latest)."""
        self.register_model(name)
        self._free_unused()
        adapter = self.adapter_name(name, step)
        with self._lock:
            if adapter in self._to_free:  # re-adding a step dropped earlier: reload it fresh
                self._to_free.remove(adapter)
        # While it loads, ``name`` goes on answering with the step before: the step is not published until
        # it is served (a request arriving now is one that arrived a moment earlier). Once it is served, or
        # once its load failed, ``name`` means this step: a failed load refuses it rather than answer with
        # the step before, and so does a step unserved later because it failed its check.
        try:
            if adapter in self.engine.adapters():
                self.engine.remove_adapter(adapter)
            self.engine.add_adapter(adapter, adapter_path, weights=weights, config=config)
        except BaseException:
            with self._lock:
                self._trained[name] = max(self._trained.get(name, 0), step)
            raise
        with self._lock:
            self._trained[name] = max(self._trained.get(name, 0), step)
            self._steps[name][step] = adapter
            latest = step == max(self._steps[name])
        if latest:  # requests that asked for the latest policy go on under this one (partial rollouts)
            self.engine.retarget(name, adapter)
        return served_name(name, step)

    def remove_step(self, name: str, step: int) -> None:
        """Stop serving an old step (new requests for it get 404) and free its adapter; the base step
        0 stays. An adapter that queued or running requests still use is freed later (next call)."""
        with self._lock:
            adapter = self._steps.get(name, {}).pop(step, None) if step != 0 else None
            if adapter is not None:
                self._to_free.append(adapter)
        self._free_unused()

    def _free_unused(self) -> None:
        with self._lock:
            pending, self._to_free = self._to_free, []
        still_busy = []
        for adapter in pending:
            try:
                if adapter in self.engine.adapters():
                    self.engine.remove_adapter(adapter)
            except EngineError:  # in use by requests that were admitted before the step was dropped
                still_busy.append(adapter)
        with self._lock:
            self._to_free.extend(still_busy)

    def model_state(self, name: str) -> dict[str, Any] | None:
        """What this registry serves of model `name` (its steps' adapters, the latest step trained and its
        short name), for `mirror_model` in another process; None when it is not registered."""
        with self._lock:
            if name not in self._steps:
                return None
            return {"steps": dict(self._steps[name]), "trained": self._trained.get(name, 0),
                    "short": self._short.get(name)}

    def mirror_model(self, name: str, state: dict[str, Any] | None) -> None:
        """Serve model `name` as another registry does (`model_state`; None: not at all), without loading or
        freeing any adapter: for a frontend of an engine core whose adapters the core's own process loads
        (backend/frontends.py), so requests here resolve to the adapters the core holds."""
        with self._lock:
            if state is None:
                self._steps.pop(name, None)
                self._short.pop(name, None)
                self._trained.pop(name, None)
                return
            self._steps[name] = {int(k): v for k, v in state["steps"].items()}
            self._trained[name] = int(state["trained"])
            if state.get("short") is not None:
                self._short[name] = state["short"]

    def add_alias(self, served_id: str, adapter_path: str | None) -> None:
        """Serve an adapter folder (or the base model, path None) under a plain id."""
        adapter = None
        if adapter_path is not None:
            adapter = served_id
            self.engine.add_adapter(adapter, adapter_path)
        with self._lock:
            self._aliases[served_id] = adapter

    def remove_alias(self, served_id: str) -> None:
        """Stop serving an adapter served under a plain id, and free it (as `remove_step`)."""
        with self._lock:
            adapter = self._aliases.pop(served_id, None)
            if adapter is not None:
                self._to_free.append(adapter)
        self._free_unused()

    def refresh(self) -> None:
        """Learn what was served or dropped elsewhere: nothing here (this registry is the one record);
        a `CoreRegistry` asks its core."""

    def steps(self, name: str) -> list[int]:
        with self._lock:
            return sorted(self._steps.get(name, {}))

    def latest_step(self, name: str) -> int:
        return self.steps(name)[-1]

    def served_ids(self) -> list[str]:
        """Every name a request may use: each model by its short name while that is unambiguous, else by
        its qualified name."""
        with self._lock:
            ids = list(self._aliases)
            shorts = list(self._short.values())
            for name, steps in self._steps.items():
                short = self._short.get(name)
                shown = short if short is not None and shorts.count(short) == 1 else name
                ids.append(shown)
                ids.extend(served_name(shown, s) for s in sorted(steps))
        return ids

    def _model_of(self, name: str) -> str | None:
        """The registered model a request's `name` means: itself, or the one model of that short name.
        Two models of one short name: ModelNotFoundError naming both (a request is never guessed)."""
        if name in self._steps:
            return name
        owners = sorted(k for k, short in self._short.items() if short == name)
        if len(owners) > 1:
            raise ModelNotFoundError(
                f"model {_shown(name)} names {len(owners)} runs served here: {owners}. Ask for one by its "
                "qualified name (model.inference_name() returns it while the short name is shared)")
        return owners[0] if owners else None

    def resolve(self, model: str) -> Resolved:
        """The adapter serving `model`, or ModelNotFoundError listing what exists. A short name is
        answered under the name asked for (``agent@3``); the follow target is the qualified model."""
        with self._lock:
            if model in self._aliases:
                return Resolved(model, self._aliases[model], None)
            asked, step_text = split_served_name(model)
            name = self._model_of(asked)
            steps = self._steps.get(name) if name is not None else None
            if name is not None and steps is not None:
                trained = self._trained.get(name, 0)
                if not step_text and not model.endswith("@"):
                    step = max(steps)
                    if step < trained:
                        raise ModelNotFoundError(
                            f"model {_shown(model)} means its latest step, {trained}, whose adapter is not served "
                            f"here (loading it failed, or it did not hold the trained weights); answering with "
                            f"step {step} would sample a stale policy. Ask for {served_name(asked, step)!r} to "
                            "sample that step on purpose, or publish the latest step again")
                    return Resolved(served_name(asked, step), steps[step], step, follow=name)
                # ASCII digits only, and few of them: "²" is a digit to str.isdigit() but not to
                # int(), and int() refuses 4300 digits or more; either is a step nobody serves. Written
                # as the server writes it ("name@1", not "name@01" or "name@"): one name per adapter.
                if (step_text.isascii() and step_text.isdigit() and len(step_text) <= 18
                        and step_text == str(int(step_text)) and int(step_text) in steps):
                    step = int(step_text)
                    return Resolved(served_name(asked, step), steps[step], step)
                raise ModelNotFoundError(
                    f"model {_shown(model)}: step {_shown(step_text)} of {asked!r} is not served"
                    f"{_why_not_served(step_text, trained)}; served steps: {sorted(steps)} (use {asked!r} for "
                    "the latest)"
                )
        raise ModelNotFoundError(
            f"model {_shown(model)} is not served here; served models: {self.served_ids()}"
        )


class CoreRegistry(ModelRegistry):
    """The names of one frontend of an engine core that several frontends feed (inference/frontends.py).

    The core's adapter set is the one record of what is served: an adapter loaded or dropped through any
    frontend (or at start) is broadcast by the core to all of them (wire.Adapters, with a version), and
    each frontend's names are derived from it, so no frontend keeps a list that could drift from another's.
    An adapter named ``<name>@<step>`` is that step of the served model `name`; any other is served by its
    own name. A name not found is looked up again after a round trip to the core: the core sends the
    change to every frontend before it answers the frontend that made it, so a request sent after a load
    was answered, to any frontend, finds it."""

    def __init__(self, engine: Any, base_name: str, name: str | None = None):
        super().__init__(engine, base_name=base_name)
        self.base_name, self.name = base_name, name if name and name != base_name else None
        if self.name is not None:
            self.register_model(self.name)
        self._synced: int | None = None

    def _sync(self) -> None:
        version = self.engine.version  # read before the set: a newer set under an older version syncs again
        if version == self._synced:
            return
        steps: dict[int, str | None] = {0: None}
        aliases: dict[str, str | None] = {self.base_name: None}
        for adapter in self.engine.adapters():
            model, step = split_served_name(adapter)
            if model == self.name and step.isascii() and step.isdigit() and step == str(int(step)) and len(step) <= 18:
                steps[int(step)] = adapter
            else:
                aliases[adapter] = adapter
        with self._lock:
            self._aliases = aliases
            if self.name is not None:
                self._steps[self.name] = steps
                self._trained[self.name] = max(steps)
            self._synced = version

    def refresh(self) -> None:
        self.engine.status()  # every change the core made before this answer has reached this frontend
        self._sync()

    def served_ids(self) -> list[str]:
        self._sync()
        return super().served_ids()

    def resolve(self, model: str) -> Resolved:
        self._sync()
        try:
            return super().resolve(model)
        except ModelNotFoundError:
            try:
                self.refresh()
            except EngineError:  # the core is gone: the name stays unknown (and any request fails anyway)
                pass
            else:
                return super().resolve(model)
            raise


def _why_not_served(step_text: str, trained: int) -> str:
    """Why a well-formed ``name@k`` has no adapter here: k is not trained yet, or no longer served."""
    if not (step_text.isascii() and step_text.isdigit() and len(step_text) <= 18 and step_text == str(int(step_text))):
        return ""
    if int(step_text) > trained:
        return f": it is not trained yet (the latest step is {trained})"
    return (": it is no longer served (the engines keep the last BackendOptions.served_steps steps and those in "
            "use; retention may have removed its checkpoint). Pin it while sampling it: async with model.pinned(k)")


def _shown(text: str, limit: int = 80) -> str:
    """`text` quoted for an error message, cut if long (a caller may send any string as a model)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"
