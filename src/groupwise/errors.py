"""The errors and warnings groupwise raises. Every error says what happened, why, and what to do.

Every error class groupwise defines is a `GroupwiseError`, so one ``except GroupwiseError`` catches
what a run, the engine, the trainer or the judge raise; where a standard exception also fits, the error
is that too (`ConfigError` is a `ValueError`, the engine's `EngineError` a `RuntimeError`,
`NonFiniteError` a `FloatingPointError`), so code written against the standard classes keeps working.
The layers define their own errors on this base (inference/requests.py, inference/constrained.py,
backend/driver.py). A wrong argument is a `ConfigError` (a value) or an `ArgumentTypeError` (a type),
so even those are caught by ``except GroupwiseError`` and by ``except ValueError`` / ``TypeError``.
tests/test_errors.py checks that every error class in the package derives from GroupwiseError and that
no module raises a plain ValueError, TypeError, RuntimeError, ... outside a short allow-list of
protocol errors (pydantic validators, ``__getattr__``'s AttributeError, NotImplementedError), each with
its reason.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable


class GroupwiseError(Exception):
    """Base class of every error groupwise raises on purpose."""


class GroupwiseWarning(UserWarning):
    """Something was skipped or worked around and the run goes on (a corrupt line, a checkpoint); the
    message names it. The CLI prints these as one line each."""


class ArtCompatWarning(UserWarning):
    """An ART argument was accepted but has no effect in groupwise (docs/porting-from-art.md).

    compat.py says why these warn instead of failing; `warn_ignored` raises them once each."""


_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_ignored(where: str, names: Iterable[str], why: str = "", *, stacklevel: int = 3) -> None:
    """Warn once per process that `names`, passed to `where`, are ignored (and `why`)."""
    with _warned_lock:
        new = sorted({str(n) for n in names} - {n for w, n in _warned if w == where})
        _warned.update((where, n) for n in new)
    if new:
        reason = f" ({why})" if why else ""
        warnings.warn(
            f"{where}: ignored {', '.join(new)}{reason}; groupwise accepts these ART arguments so ported "
            "code runs, but they have no effect here (docs/porting-from-art.md lists every one).",
            ArtCompatWarning, stacklevel=stacklevel,
        )


def warn_art_difference(where: str, key: str, message: str, *, stacklevel: int) -> None:
    """Warn once per process (per `where` and `key`) that a ported ART program gets groupwise's behaviour
    where ART's differs (a default, a measure): `message` says what differs and how to get ART's."""
    with _warned_lock:
        if (where, key) in _warned:
            return
        _warned.add((where, key))
    warnings.warn(f"{where}: {message} (docs/porting-from-art.md)", ArtCompatWarning, stacklevel=stacklevel)


class ConfigError(GroupwiseError, ValueError):
    """A config or argument is invalid. Lists every problem found, not just the first."""

    def __init__(self, problems: list[str] | str, *, what: str = "config"):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid {what} ({len(self.problems)} problem(s)):\n{lines}")


class ArgumentTypeError(GroupwiseError, TypeError):
    """An argument is not of a type groupwise takes (a Backend, a TrajectoryGroup, a number, ...); the
    message names the argument, the type it got and the type it takes."""


class InvalidDataError(GroupwiseError, ValueError):
    """Data groupwise was handed or reads cannot be used as it is (a file in another format, a
    conversation the chat template cannot split into turns, a token sequence that does not fit its
    logprobs); the message names where and what to do."""


class AmbiguousHistoryError(InvalidDataError):
    """Captured model calls that do not make one trajectory unambiguously (calls to several models, a
    history that branches); the message names the argument of `capture_auto_trajectory` that picks one."""


class GatherError(GroupwiseError):
    """More rollouts raised than `max_exceptions` allows. Carries the exceptions recorded so far."""

    def __init__(self, message: str, exceptions: list | None = None):
        super().__init__(message)
        self.exceptions = exceptions or []


class RolloutTimeoutError(GroupwiseError, TimeoutError):
    """A rollout ran longer than its timeout (`LoopConfig.rollout_timeout_s`, or the gather functions'
    `rollout_timeout_s`). It was cancelled and counts against `max_exceptions` like a rollout that raised;
    the message says where it was waiting."""


class RolloutResultError(GroupwiseError, TypeError):
    """A rollout returned something that is neither a `Trajectory` nor an iterable of them. A bug in the
    rollout, not a failed episode: raised at once, never counted against `max_exceptions`."""


class StoreError(GroupwiseError):
    """The run store could not be read or written."""


class CorruptRecordError(StoreError):
    """A line of a store file does not parse. Names the file and the line number."""

    def __init__(self, path: str, line: int, reason: str):
        self.path, self.line, self.reason = path, line, reason
        super().__init__(
            f"{path}:{line}: corrupt record ({reason}). "
            "Pass skip_corrupt=True to read the remaining lines, or fix/remove that line."
        )


class RunLockedError(StoreError):
    """Another process is writing this run folder (it holds the folder's lock); names that process."""


class RunFolderError(StoreError, OSError):
    """A run folder cannot be created or written (a read-only or full disk, a path under a folder that
    takes no new entries, no permission); names the folder and the system's reason. An OSError too, so
    code that catches the system's error still does."""


class CheckpointError(StoreError):
    """A checkpoint cannot be used (a file missing, truncated or changed since it was saved). Names the file."""


class NotRegisteredError(GroupwiseError, ValueError):
    """A model was used (its backend, its client) before `await model.register(backend)`. A ValueError
    too, as ART raises there, so a ported ``except ValueError`` still catches it."""


class ModelNotFoundError(GroupwiseError):
    """A base model or a served model name (`name@step`) does not exist."""


class NotTrainableError(GroupwiseError):
    """Nothing in a batch can be trained on; the message says which reason applies."""


class NonFiniteError(GroupwiseError, FloatingPointError):
    """A training step produced a nan or inf loss, gradient or adapter. The step was undone (the adapter
    and optimizer state are as before it) and nothing was checkpointed; the message names the likely
    setting (the learning rate, the rewards)."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint was saved for another base model or LoRA config (its tensors do not fit the model):
    load it with the config that saved it, or train under a new model name."""


class TeacherMismatchError(GroupwiseError, ValueError):
    """A distillation teacher on another base model cannot score the student's tokens: its tokenizer maps
    ids to other tokens, or its LM head does not cover the student's ids. The message says what differs."""


class DiskFullError(CheckpointError, OSError):
    """A checkpoint could not be written because its disk is full. The partial folder was removed and the
    previous checkpoints are untouched; the message names the folder."""


class UnknownKeyError(GroupwiseError, KeyError):
    """A name looked up is not there (a reward component, ...); the message lists the names there are."""

    def __str__(self) -> str:  # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


class EnvError(GroupwiseError, RuntimeError):
    """A built-in environment cannot run here (a missing SQLite feature, a server that answered nothing
    usable, a corpus that no longer fits its scenarios)."""


class MemoryBudgetError(GroupwiseError, MemoryError):
    """A device has less free memory than a backend's budget for a base model (backend/budget.py): the
    backend refused before its engine and trainers allocated, instead of crashing another run."""


class AdapterMismatchError(GroupwiseError):
    """The inference engine answered with a different step than the trainer just saved."""


class JudgeError(GroupwiseError):
    """The judge failed after its retries. `raw` holds the judge's last raw answer (or None)."""

    def __init__(self, message: str, raw: str | None = None):
        super().__init__(message)
        self.raw = raw


class JudgeUnreachableError(JudgeError):
    """The judge's endpoint could not be reached on any attempt (refused, no route, DNS): a setting to fix
    (the URL, or the server is down), not a bad answer. Names the URL and what chose it."""


class RewardAuditError(GroupwiseError):
    """The reward audit found answers without content that score at or above honest answers; `report` is
    the audit (`groupwise.loop.audit.AuditReport`)."""

    def __init__(self, message: str, report: object = None):
        super().__init__(message)
        self.report = report


class JudgeSelectionError(GroupwiseError):
    """No candidate judge cleared the bar on the labelled set; `table` is the evaluation, `reports` its rows."""

    def __init__(self, message: str, table: str = "", reports: list | None = None):
        super().__init__(message)
        self.table = table
        self.reports = reports or []


class MissingDependencyError(GroupwiseError, ImportError):
    """An optional extra is needed for this feature. Says which `pip install` fixes it."""

    def __init__(self, feature: str, extra: str, missing: str):
        super().__init__(
            f"{feature} needs the '{missing}' package, which is not installed. "
            f"Install it with: pip install 'groupwise[{extra}]'"
        )


class ArtInternalModuleError(GroupwiseError, ModuleNotFoundError):
    """An import of one of ART's internal modules (its Unsloth, vLLM, Megatron or Tinker machinery,
    LocalBackend's internals), which groupwise has no counterpart of. Says what the module was and what
    to use instead; a ModuleNotFoundError, so ``try: ... except ImportError`` fallbacks still apply."""


class ArtNameNotProvided(GroupwiseError, AttributeError):
    """A name of ART's API that groupwise does not provide; the message says why and what to use instead
    (`groupwise.core.compat.NOT_PROVIDED`)."""


class ScenarioGenerationError(GroupwiseError, ValueError):
    """An LLM asked to write scenarios (`groupwise.mcp.generate_scenarios`) answered with something that
    is not the scenarios asked for. A ValueError too, as ART raises."""
