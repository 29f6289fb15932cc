"""What every config dataclass shares: fields with help text, one error listing every problem, and
the checks configs run on their values.

Apart from config.py so that other modules' settings (the judge's, a backend's options, the CLI's
fields) build on the same rules without importing every entry point's config.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import field
from typing import Any

from groupwise.errors import ConfigError


def option(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with help text (shown by `describe()` and the CLI)."""
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def config_field(config: type, name: str) -> dataclasses.Field:
    """Field `name` of the config dataclass `config`; a `GroupwiseError`-family ConfigError naming the
    fields it has when there is none (a flag or argument that says it feeds a field the config lost)."""
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        if f.name == name:
            return f
    raise ConfigError(f"{config.__name__} has no field {name!r}; its fields: "
                      f"{', '.join(f.name for f in dataclasses.fields(config))}", what=config.__name__)  # type: ignore[arg-type]


def field_default(config: type, name: str) -> Any:
    """The default of a config's field (its factory's value for a mutable one): a signature or a flag that
    sets the field takes it from here rather than writing it again (one owner per default)."""
    f = config_field(config, name)
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def field_help(config: type, name: str) -> str:
    """The help of a config's field (`option`'s text): what a flag or an argument that sets the field says."""
    return config_field(config, name).metadata.get("help", "")


class Validated:
    """Mixin: subclasses list their problems; construction fails with all of them together."""

    def problems(self) -> list[str]:  # pragma: no cover - overridden
        return []

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Raise one ConfigError listing every problem. Run when the config is built, and again by a
        backend before a step uses it: a field assigned after construction is checked too."""
        problems = self.problems()
        if problems:
            raise ConfigError(problems, what=type(self).__name__)

    @classmethod
    def describe(cls) -> str:
        lines = [f"{cls.__name__}:"]
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "required"  # type: ignore[misc]
            )
            lines.append(f"  {f.name} = {default!r}\n      {f.metadata.get('help', '')}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    # ART's configs are pydantic models: code that serialises or copies one (a remote backend's client
    # sends ``config.model_dump(mode="json")``) finds the same calls here, on the same fields.
    def model_dump(self, *, mode: str = "python", exclude_none: bool = False, **_: Any) -> dict[str, Any]:
        out = self.to_dict()
        if mode == "json":
            out = json.loads(json.dumps(out, allow_nan=True))
        return {k: v for k, v in out.items() if v is not None} if exclude_none else out

    def model_dump_json(self, **kwargs: Any) -> str:
        return json.dumps(self.model_dump(mode="json", **kwargs), allow_nan=True)

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> Any:
        """A copy with `update` applied, checked as a new config is (and, for a config that records what
        its caller set, setting what the original set plus `update`'s fields)."""
        new = replace_set(self, **(update or {}))
        return copy.deepcopy(new) if deep else new

    @classmethod
    def model_validate(cls, obj: Any) -> Any:
        """`obj` if it is one already, else the config its fields make (a dict, as model_dump gave)."""
        return obj if isinstance(obj, cls) else cls(**dict(obj))


def records_set_fields(cls: type | None = None, *, aliases: Mapping[str, str] | None = None) -> Any:
    """Class decorator (over ``@dataclass``): the config records which fields its caller SET, at
    construction (by keyword, by position, or through an alias: an InitVar such as ART's ``beta`` that
    sets ``kl_coef``) or by assignment afterwards, as pydantic's ``model_fields_set`` (ART's configs are
    pydantic models). A setting is then resolved by what was set, never by comparing a value with its
    default: ``TrainConfig(learning_rate=1e-5)`` sets the rate even though 1e-5 is the default."""
    def decorate(cls: type) -> type:
        init = cls.__init__
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        known = frozenset(names)
        via = dict(aliases or {})

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            object.__setattr__(self, "_fields_set", None)  # the constructor's own assignments are not the caller's
            init(self, *args, **kwargs)
            given = {via.get(k, k) for k, v in kwargs.items() if k in known or (k in via and v is not None)}
            object.__setattr__(self, "_fields_set", frozenset(given | set(names[:len(args)])))

        def __setattr__(self: Any, name: str, value: Any) -> None:
            object.__setattr__(self, name, value)
            recorded = self.__dict__.get("_fields_set")
            if recorded is not None and name in known:  # a new frozenset: a shallow copy keeps its own record
                object.__setattr__(self, "_fields_set", recorded | {name})

        cls.__init__ = __init__  # type: ignore[misc]
        cls.__setattr__ = __setattr__  # type: ignore[assignment]
        cls.model_fields_set = property(  # type: ignore[attr-defined]
            lambda self: frozenset(self.__dict__.get("_fields_set") or ()),
            doc="The fields the caller set (pydantic's name): at construction, or assigned since.")
        return cls

    return decorate(cls) if cls is not None else decorate


def fields_set(config: Any) -> frozenset[str]:
    """The fields `config`'s caller set (`records_set_fields`); every field for a config that does not
    record them (nothing can say its values were not chosen)."""
    recorded = getattr(config, "model_fields_set", None)
    if recorded is None:
        return frozenset(f.name for f in dataclasses.fields(config))
    return frozenset(recorded)


def replace_set(config: Any, **changes: Any) -> Any:
    """`dataclasses.replace` that keeps what the caller set: the original's set fields plus `changes`'
    (a plain replace passes every field to the constructor, so every field would read as set)."""
    new = dataclasses.replace(config, **changes)
    if "_fields_set" in getattr(config, "__dict__", {}):
        object.__setattr__(new, "_fields_set", fields_set(config) | set(changes))
    return new


class SetValues:
    """The values callers set for one config, by field, each with where it was set (`source`). Setting a
    field again to another value is refused with a ConfigError naming both places: one owner per
    setting, never a silent override."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def set(self, name: str, value: Any, source: str) -> None:
        if name in self.values and not _same(self.values[name], value):
            raise ConfigError(
                [f"{self.sources[name]}={self.values[name]!r} and {source}={value!r} disagree (two places set "
                 f"{name}); set it once"], what=self.what)
        self.values.setdefault(name, value)
        self.sources.setdefault(name, source)

    def __contains__(self, name: str) -> bool:
        return name in self.values


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b) or (is_number(a) and is_number(b) and a == b)


def is_number(value: Any) -> bool:
    # bool is an int to Python, but True as a learning rate is a typo, not a setting.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_number(problems: list[str], name: str, value: Any, *, low: float | None = None,
                 high: float | None = None, low_open: bool = False, high_open: bool = False,
                 integer: bool = False) -> None:
    """Append a problem unless `value` is a finite number (an int when `integer`) in the range.

    nan and inf fail every setting: nan compares False with every bound, so an unchecked nan passes
    ``value < 0`` and poisons the first step (an inf learning rate writes a NaN adapter).
    None is a missing optional value and is not checked here.
    """
    if value is None:
        return
    bounds = dict(low=low, high=high, low_open=low_open, high_open=high_open, integer=integer)
    if not number_fits(value, **bounds):
        problems.append(f"{name}={value!r} must be {number_requirement(**bounds)}")


def number_requirement(*, low: float | None = None, high: float | None = None, low_open: bool = False,
                       high_open: bool = False, integer: bool = False) -> str:
    """What `check_number` asks of a value, in words: ``an integer >= 1``, ``a finite number in (0, 1]``."""
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if low_open else '>='} {low:g}")
    if high is not None:
        bounds.append(f"{'<' if high_open else '<='} {high:g}")
    if low is not None and high is not None:
        allowed = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    else:
        allowed = " and ".join(bounds)
    kind = "an integer" if integer else "a finite number"
    return f"{kind} {allowed}".strip()


def number_fits(value: Any, *, low: float | None = None, high: float | None = None, low_open: bool = False,
                high_open: bool = False, integer: bool = False) -> bool:
    """Whether `value` is what `number_requirement` describes (bool is no number: True as a rate is a typo)."""
    if integer:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = is_number(value) and math.isfinite(value)
    return ok and not ((low is not None and (value < low or (low_open and value == low)))
                       or (high is not None and (value > high or (high_open and value == high))))


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (``localhost`` or a loopback address): the rule `groupwise serve`
    and `groupwise dashboard` share, since anything else lets the network in and needs an API key."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_positive(problems: list[str], name: str, value: Any, *, allow_zero: bool = False,
                   integer: bool = False) -> None:
    check_number(problems, name, value, low=0, low_open=not allow_zero, integer=integer)


def check_fraction(problems: list[str], name: str, value: Any, *, closed: bool = True) -> None:
    check_number(problems, name, value, low=0, high=1, low_open=not closed, high_open=not closed)


def check_seed(problems: list[str], name: str, value: Any) -> None:
    check_number(problems, name, value, low=0, integer=True)


def check_choice(problems: list[str], name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        problems.append(f"{name}={value!r} must be one of {list(choices)}")
