"""A job's settings: one dataclass per command, each field one flag with its help, type, default and checks.

The dataclass is the only place a command's setting is declared. cli.py builds the parser from it
(`flags`): the flag's name from the field's (``batch_size`` -> ``--batch-size``, a one-letter ``n`` ->
``-n``), its type and choices from the annotation (``int | None``, ``Literal["a", "b"]``, ``list[int]``),
its help, bounds and checks from the field's metadata (`arg`), and the default shown in the help from the
field's default. A field whose value goes into a config's field says so (``feeds=(LoopConfig, "seed")``):
the flag then refuses what that config refuses, by the config's own check (`config_problem`), so a bound
is written once, in the config, and an out-of-range value is one line before anything loads. Building the dataclass checks every value the same way (`Job.problems`), so a job made
in Python is refused as the command line would refuse it, before anything loads. Adding a flag is adding
a field.

List-valued fields take either one comma-separated value (``--seeds 0-3`` or ``--lr 5e-4,1e-3``: an
integer list also takes ranges ``a-b``, both ends included) or, with ``repeat=True``, the flag once per
value (``--judge a --judge b``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

from groupwise.core.validated import Validated, number_fits, number_requirement
from groupwise.errors import ArgumentTypeError

__all__ = ["Command", "Flag", "Job", "arg", "config_drift", "flags", "parse_text", "settings_problems"]

# check(value) -> None, or what is wrong with it in one sentence that names the value.
Check = Callable[[Any], "str | None"]


def arg(default: Any = MISSING, *, help: str | None = None, default_factory: Any = MISSING, positional: bool = False,
        low: float | None = None, high: float | None = None, low_open: bool = False, high_open: bool = False,
        feeds: tuple[type, str] | None = None, own_default: str | None = None,
        check: Check | None = None, on_machine: Check | None = None, repeat: bool = False,
        metavar: str | None = None, exclusive: str | None = None, flag: str | None = None) -> Any:
    """A job field. `help` says what the setting does (the default is appended by the CLI, never written
    in the help); `low`/`high`/`low_open`/`high_open` bound a number (each element of a list); `feeds`
    names the config field the value goes into, whose own check the flag applies (module doc); `check`
    refuses a value by itself, as argparse parses it; `on_machine` refuses one this machine cannot serve
    (a missing local model, an absent CUDA device), after parsing; `repeat` makes a list field a
    repeatable flag; fields sharing an `exclusive` name are mutually exclusive flags; `flag` overrides the
    flag's name.

    A field that `feeds` a config field is derived from it, so the two cannot drift apart: its help is the
    config field's help, followed by `help` (what the job adds); its default is the config field's, unless
    the field names one. A default of its own is None (not given: the help says who decides then) or
    says why it differs in `own_default` (a job's preset); `config_drift` holds every job to that."""
    if feeds is not None:
        from groupwise.core.validated import field_default, field_help

        said = field_help(*feeds).strip()
        help = said if not help else f"{said} {help}"
        if default is MISSING and default_factory is MISSING:
            default = field_default(*feeds)
    elif help is None:
        raise ArgumentTypeError("a job field needs help= (or feeds=, whose config field's help it takes)")
    metadata = {"help": help, "positional": positional, "low": low, "high": high, "low_open": low_open,
                "high_open": high_open, "feeds": feeds, "own_default": own_default,
                "check": check, "on_machine": on_machine, "repeat": repeat, "metavar": metavar,
                "exclusive": exclusive, "flag": flag}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Flag:
    """One field of a job, as the command line sees it."""

    name: str  # the field's name
    flag: str  # --batch-size, -n, or the field's name for a positional argument
    kind: type  # the type of the value (of each element, for a list): int, float, str or bool
    many: bool  # a list of values
    optional: bool  # None is allowed (and means "not given": the help says what then)
    choices: tuple[Any, ...] | None  # from a Literal annotation
    default: Any  # MISSING when required
    help: str
    meta: dict[str, Any]

    @property
    def bounds(self) -> dict[str, Any]:
        return {"low": self.meta["low"], "high": self.meta["high"], "low_open": self.meta["low_open"],
                "high_open": self.meta["high_open"], "integer": self.kind is int}

    @property
    def bounded(self) -> bool:
        """Whether some values of the flag's type are refused by a bound (its own or its config's)."""
        return self.meta["low"] is not None or self.meta["high"] is not None or self.meta["feeds"] is not None

    def problem(self, value: Any, shown: str) -> str | None:
        """What is wrong with one value (one element of a list), `shown` as the user wrote it; None if fine."""
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}, got {shown}"
        if self.kind in (int, float) and not number_fits(value, **self.bounds):
            return f"must be {number_requirement(**self.bounds)}, got {shown}"
        if self.kind is str and not isinstance(value, str):
            return f"must be a string, got {shown}"
        check = self.meta["check"]
        problem = check(value) if check is not None else None
        if problem is None and self.meta["feeds"] is not None:
            problem = config_problem(*self.meta["feeds"], value)
            if problem is not None and problem.startswith("must "):
                problem = f"{problem}, got {shown}"
        return problem

    def help_text(self) -> str:
        shown = self.default
        if shown is MISSING or shown is None or shown is False or shown == []:
            return self.help  # the help says what leaving it out does
        if self.many and isinstance(shown, (list, tuple)):
            shown = ",".join(map(str, shown))
        return f"{self.help} (default: {shown})"


def config_drift(job: type) -> list[str]:
    """Where a job's flag has drifted from the config field it feeds: its help does not begin with the
    field's help (written again rather than derived), or its default differs from the field's without
    saying why (`own_default`), or says why while it is the field's after all. Empty when none has."""
    from groupwise.core.validated import field_default, field_help

    found = []
    for spec in flags(job):
        if spec.meta["feeds"] is None:
            continue
        config, name = spec.meta["feeds"]
        where = f"{job.__name__}.{spec.name} ({spec.flag}, feeds {config.__name__}.{name})"
        if not spec.help.startswith(field_help(config, name).strip()):
            found.append(f"{where}: its help does not begin with the field's help")
        theirs, why = field_default(config, name), spec.meta["own_default"]
        if spec.default is None or spec.default is MISSING:
            continue  # not given: the job decides (a preset), as its help says
        if spec.default != theirs and not why:
            found.append(f"{where}: default {spec.default!r}, the field's is {theirs!r}; derive it, or say why in "
                         "own_default")
        elif spec.default == theirs and why:
            found.append(f"{where}: own_default says it differs, but it is the field's {theirs!r}")
    return found


def config_problem(config: type, name: str, value: Any) -> str | None:
    """What `config`'s own check says of `value` as its field `name` (the other fields at their
    defaults), in the flag's words (``must be an integer >= 0``); None when it takes it."""
    from groupwise.errors import ConfigError

    try:
        config(**{name: value})
    except ConfigError as exc:
        said = f"{name}={value!r} "
        return "; ".join(p.removeprefix(said) for p in exc.problems if p.startswith(said)) or None
    return None


def settings_problems(settings: "dict[tuple[type, str], Any]") -> list[str]:
    """What is wrong with values meant for config fields, keyed by (config, field name): a field the config
    does not have (its fields named), or a value its own check refuses (`config_problem`). Empty when the
    configs take them all: what holds a job's preset to the configs it sets."""
    from groupwise.core.validated import config_field
    from groupwise.errors import ConfigError

    found = []
    for (config, name), value in settings.items():
        try:
            config_field(config, name)
        except ConfigError as exc:
            found.append(" ".join(str(exc).split()))
            continue
        problem = config_problem(config, name, value)
        if problem is not None:
            found.append(f"{config.__name__}.{name}={value!r}: {problem}")
    return found


def _unwrap(annotation: Any) -> tuple[type, bool, bool, tuple[Any, ...] | None]:
    """(element type, many, optional, choices) of a field's annotation."""
    optional = False
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        optional = len(rest) < len(args)
        if len(rest) != 1:
            raise ArgumentTypeError(f"a job field is one type, optionally with None; got {annotation!r}")
        annotation = rest[0]
    many = typing.get_origin(annotation) in (list, tuple)
    if many:
        annotation = typing.get_args(annotation)[0]
    choices = None
    if typing.get_origin(annotation) is Literal:
        choices = typing.get_args(annotation)
        annotation = type(choices[0])
    if annotation not in (int, float, str, bool):
        raise ArgumentTypeError(f"a job field holds int, float, str or bool (or a list of one); got {annotation!r}")
    return annotation, many, optional, choices


def flags(job: type) -> list[Flag]:
    """The fields of a job dataclass, as flags."""
    hints = typing.get_type_hints(job, vars(sys.modules[job.__module__]))
    out = []
    for f in dataclasses.fields(job):
        kind, many, optional, choices = _unwrap(hints[f.name])
        default = f.default if f.default is not MISSING else (
            f.default_factory() if f.default_factory is not MISSING else MISSING)
        flag = f.metadata.get("flag") or (f.name if f.metadata.get("positional") else
                                          f"-{f.name}" if len(f.name) == 1 else f"--{f.name.replace('_', '-')}")
        out.append(Flag(f.name, flag, kind, many, optional, choices, default, f.metadata.get("help", ""),
                        dict(f.metadata)))
    return out


_RANGE = re.compile(r"^(\d+)-(\d+)$")


def parse_text(spec: Flag, text: str) -> Any:
    """The value of one command-line word for `spec` (a list for a comma-separated list field); ValueError
    with the flag's requirement when the word is not one."""
    if spec.many and not spec.meta["repeat"]:
        values: list[Any] = []
        for part in text.split(","):
            part = part.strip()
            span = _RANGE.match(part) if spec.kind is int else None
            if span and int(span[1]) > int(span[2]):  # not "an integer": say what it is and how to write it
                raise ValueError(f"the range {part!r} runs backwards; write {span[2]}-{span[1]}")
            if span:
                values.extend(range(int(span[1]), int(span[2]) + 1))
            else:
                values.append(_one(spec, part, shown=repr(part)))
        return values
    return _one(spec, text, shown=repr(text))


def _one(spec: Flag, text: str, shown: str) -> Any:
    value: Any = text
    if spec.kind is int:
        try:
            value = int(text)
        except ValueError:
            value = None
    elif spec.kind is float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
    problem = spec.problem(value, shown) if value is not None else (
        f"must be {number_requirement(**spec.bounds)}, got {shown}")
    if problem:
        raise ValueError(problem)
    return value


class Job(Validated):
    """Base of the job dataclasses: every field checked as its flag is (`Flag.problem`, the `on_machine`
    checks), then the job's own rules between fields (`rules`)."""

    def problems(self) -> list[str]:
        found = []
        for spec in flags(type(self)):
            value = getattr(self, spec.name)
            if value is None and (spec.optional or spec.default is None):
                continue
            values = value if spec.many and isinstance(value, (list, tuple)) else [value]
            if spec.many and not isinstance(value, (list, tuple)):
                found.append(f"{spec.flag}: must be a list, got {value!r}")
                continue
            if spec.kind is bool:
                if not isinstance(value, bool):
                    found.append(f"{spec.flag}: must be True or False, got {value!r}")
                continue
            bad = [p for v in values if (p := spec.problem(v, repr(v)))]
            found.extend(f"{spec.flag}: {p}" for p in bad)
            machine = spec.meta["on_machine"]
            if not bad and machine is not None:  # named as the user wrote it: `--model ./x: ...`, `runs/a: ...`
                said = "" if spec.meta["positional"] else f"{spec.flag} "
                found.extend(f"{said}{v}: {p}" for v in values if (p := machine(v)))
        return found + self.rules()

    def rules(self) -> list[str]:
        """Problems between fields (a key needed off loopback, several judges need a labelled set)."""
        return []


@dataclass(frozen=True)
class Command:
    """A command of the `groupwise` CLI: its name (``judge eval`` for a nested one), its job dataclass, the
    function that runs a job (returning the exit code), and the texts of its help."""

    name: str
    job: type[Job]
    run: Callable[[Any], "int | None"]
    help: str
    description: str | None = None
    epilog: str | None = None
    interrupted: str | None = None  # what a Ctrl-C left behind and how to go on, said after "interrupted"
