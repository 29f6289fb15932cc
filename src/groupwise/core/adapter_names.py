"""One name for a trained adapter: ``name@step``, the model id it is served under (ART's name too).

The same weights have machine names inside groupwise: the trainer's peft adapter (peft's
``"default"``) and, in every engine that serves them, the peft adapter of the slot holding a copy
(``"gw-slot-<k>"``, inference/adapter_slots.py). Those stay inside the trainer and the engine:
the registry loads each step into the engine under its served name, so every log line, error and
response names an adapter by what `served_name` returns, and a user can paste it into a request.
"""

from __future__ import annotations

__all__ = ["served_name", "split_served_name"]


def served_name(model: str, step: int | None = None) -> str:
    """``agent@3`` for step 3 of model ``agent``; the plain model name (its latest step) for None."""
    return model if step is None else f"{model}@{step}"


def split_served_name(name: str) -> tuple[str, str]:
    """(model, step text) of a served name: ``"agent@3"`` -> ``("agent", "3")``, ``"agent"`` -> ``("agent", "")``.

    A run's qualified name (``<project>/<run>``, groupwise/runs/run_id.py) is split after its last ``/``: a
    project folder may hold an ``@`` (``"team@x/agent@3"`` -> ``("team@x/agent", "3")``)."""
    head, slash, tail = name.rpartition("/")
    model, _, step = tail.partition("@")
    return head + slash + model, step
