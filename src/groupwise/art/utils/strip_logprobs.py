"""`strip_logprobs`: a copy of a trajectory, message or response without its token logprobs.

ART's notebooks pass it to a tracing library (weave's ``postprocess_output``) so traces do not store
128 logprob entries a token; it is a display helper, never used for training, which needs them.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

__all__ = ["strip_logprobs"]

log = logging.getLogger("groupwise.art.utils")


# ``token_logprobs``: the list form a groupwise client gets (groupwise.core.choices.TOKEN_DATA_HEADER)
_KEYS = ("logprobs", "token_logprobs")


def strip_logprobs(obj: Any) -> Any:
    """A deep copy of `obj` where every ``logprobs`` entry is gone: dict keys are dropped, attributes
    (a pydantic `Choice`'s) set to None, and a `Choice`'s extra ``token_logprobs`` (the list form of
    groupwise's own client) dropped. An object that cannot be copied comes back as it is, with a
    warning: the caller is a logger, which must not fail the rollout."""
    try:
        copied = copy.deepcopy(obj)
    except Exception as exc:  # noqa: BLE001 - any object may be handed to a tracer
        log.warning("strip_logprobs: %s could not be copied (%s); returned unchanged", type(obj).__name__, exc)
        return obj
    return _without_logprobs(copied)


def _without_logprobs(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_logprobs(v) for k, v in obj.items() if k not in _KEYS}
    if isinstance(obj, (list, tuple)):
        items = [_without_logprobs(v) for v in obj]
        return type(obj)(items) if isinstance(obj, list) else tuple(items)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        for name, value in list(vars(obj).items()):
            object.__setattr__(obj, name, None if name == "logprobs" else _without_logprobs(value))
        extra = getattr(obj, "__pydantic_extra__", None)  # a pydantic model's extra fields live outside vars()
        if isinstance(extra, dict):
            for name in list(extra):
                if name in _KEYS:
                    del extra[name]
                else:
                    extra[name] = _without_logprobs(extra[name])
    return obj
