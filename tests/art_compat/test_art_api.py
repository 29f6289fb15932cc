"""groupwise's API against ART's released API, name by name and parameter by parameter.

art_api_snapshot.json holds facts about the public API of ART 0.1 to 0.5 (written from the wheels by
scripts/art_api_snapshot.py; ART is never imported): the last release of each minor version in full, and
of every other release from 0.3.0 the names whose facts differ from those. This test imports groupwise's counterpart of each
public module and name, inspects its signatures, and lists every difference an ART program could trip
on: a module or name that is missing, a parameter that is missing, not at ART's position or required,
a default that differs, a pydantic/dataclass field that is missing, a method that is missing or not
async as ART's. Each must be listed, with its reason, in the "Checked differences" table of
docs/porting-from-art.md; a listed difference that no longer exists fails too, so the table stays true.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import re
from pathlib import Path
from typing import Any

from groupwise.errors import MissingDependencyError

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = json.loads((Path(__file__).with_name("art_api_snapshot.json")).read_text())
DOC = ROOT / "docs" / "porting-from-art.md"
P = inspect.Parameter


def groupwise_path(art_module: str) -> str:
    return "groupwise" + art_module[len("art"):]


def literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return inspect.Parameter.empty  # an expression (a name, a call): not compared


def same_value(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class Differences:
    def __init__(self) -> None:
        self.found: dict[tuple[str, str], list[str]] = {}

    def add(self, path: str, what: str, detail: str, version: str) -> None:
        self.found.setdefault((path, what), []).append(f"{version}: {detail}")

    def params(self, path: str, art: list[dict[str, Any]], target: Any, version: str, *, bound: bool = False,
               only: tuple[str, ...] | None = None) -> None:
        """Compare ART's parameters with `target`'s (`bound`: a method looked up on its class, whose
        first parameter is self; `only`: record only these kinds of difference)."""
        if only is not None:
            sub = Differences()
            sub.params(path, art, target, version, bound=bound)
            for (where, what), details in sub.found.items():
                if what in only:
                    self.found.setdefault((where, what), []).extend(details)
            return
        try:
            sig = inspect.signature(target)
        except (TypeError, ValueError):
            return
        ours = list(sig.parameters.values())[1 if bound else 0:]
        fields = getattr(target, "model_fields", None) if isinstance(target, type) else None
        if fields:  # a pydantic default_factory shows as a placeholder: compare what it makes
            ours = [p.replace(default=fields[p.name].default_factory())
                    if p.name in fields and fields[p.name].default_factory is not None else p for p in ours]
        by_name = {p.name: p for p in ours}
        var_kw = any(p.kind is P.VAR_KEYWORD for p in ours)
        positional = [p.name for p in ours if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
        # a positional-only parameter takes ART's argument at its index, whatever its name
        anonymous = {i for i, name in enumerate(positional) if by_name[name].kind is P.POSITIONAL_ONLY}
        art_positional = [a["name"] for a in art if a["kind"] in ("positional_only", "positional_or_keyword")]
        for a in art:
            name, kind = a["name"], a["kind"]
            if kind == "var_keyword":
                continue  # ART's **kwargs are typed Never or forwarded to ART's own machinery
            if kind == "var_positional":
                if not any(p.kind is P.VAR_POSITIONAL for p in ours):
                    self.add(f"{path}(*{name})", "missing", "ART takes extra positional arguments", version)
                continue
            ours_p = by_name.get(name)
            if ours_p is None:
                if not var_kw:
                    self.add(f"{path}({name})", "missing", "ART's parameter is not accepted", version)
                else:  # accepted through **kwargs, but a program that inspects the signature does not see it
                    self.add(f"{path}({name})", "hidden", "ART's parameter is only in **kwargs", version)
                continue
            if kind != "keyword_only":  # ART callers may pass it by position
                index = art_positional.index(name)
                if index >= len(positional) or (positional[index] != name and index not in anonymous):
                    self.add(f"{path}({name})", "position", f"ART's position {index}, groupwise's "
                             f"{positional.index(name) if name in positional else 'keyword only'}", version)
            if "default" in a:
                if ours_p.default is P.empty:
                    self.add(f"{path}({name})", "required", f"ART's default {a['default']}", version)
                else:
                    value = literal(a["default"])
                    if value is not P.empty and not same_value(value, ours_p.default):
                        self.add(f"{path}({name})", "default", f"ART {a['default']}, groupwise {ours_p.default!r}", version)
        art_names = {a["name"] for a in art}
        for p in ours:
            if p.name not in art_names and p.default is P.empty and p.kind not in (P.VAR_KEYWORD, P.VAR_POSITIONAL):
                self.add(f"{path}({p.name})", "extra required", "groupwise requires a parameter ART does not have", version)

    def function(self, path: str, fact: dict[str, Any], obj: Any, version: str, *, bound: bool = False) -> None:
        # `async def` with `yield` (an async generator, e.g. trajectory_group_batches) is async too
        is_async = inspect.iscoroutinefunction(obj) or inspect.isasyncgenfunction(obj)
        if fact.get("async") is not None and is_async != fact["async"]:
            self.add(path, "async", f"ART's is {'' if fact['async'] else 'not '}async", version)
        self.params(path, fact["params"], obj, version, bound=bound)

    def cls(self, path: str, fact: dict[str, Any], obj: Any, version: str) -> None:
        if not isinstance(obj, type):
            self.add(path, "not a class", f"groupwise's is {type(obj).__name__}", version)
            return
        if "init" in fact:
            self.params(path, fact["init"], obj, version)
            init = inspect.getattr_static(obj, "__init__", None)
            if inspect.isfunction(init) and init.__qualname__.split(".")[0] == obj.__name__:
                # its own __init__, as `inspect.signature(art.Model.__init__)` sees it (a program's self-check)
                # (defaults and positions are the class's, compared above)
                self.params(f"{path}.__init__", fact["init"], init, version, bound=True, only=("hidden", "missing"))
        if fact.get("flavour") in ("pydantic", "dataclass"):
            ours = set(getattr(obj, "model_fields", {})) | (
                {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set())
            for field in fact["fields"]:
                if field not in ours and not hasattr(obj, field):
                    self.add(f"{path}.{field}", "missing field", "ART's field is not a field here", version)
        for name, method in fact.get("methods", {}).items():
            static = inspect.getattr_static(obj, name, None)
            if static is None and name not in getattr(obj, "model_fields", {}):
                self.add(f"{path}.{name}", "missing", f"ART's {method['kind']}", version)
            elif method["kind"] == "method" and inspect.isfunction(static):
                self.function(f"{path}.{name}", method, static, version, bound=True)
            elif method["kind"] == "method" and isinstance(static, (staticmethod, classmethod)):
                self.function(f"{path}.{name}", method, getattr(obj, name), version)

    def name(self, module: Any, art_module: str, name: str, fact: dict[str, Any], version: str) -> None:
        path = f"{art_module}.{name}"
        if fact["kind"] == "unresolved":
            return  # listed in ART's __all__ but never defined there (0.5.18's art.LocalBackend)
        if not hasattr(module, name):
            self.add(path, "missing", f"ART's {fact.get('flavour', fact['kind'])}", version)
        elif fact["kind"] == "function":
            self.function(path, fact, getattr(module, name), version)
        elif fact["kind"] == "class":
            self.cls(path, fact, getattr(module, name), version)


def differences() -> dict[tuple[str, str], list[str]]:
    diff = Differences()
    # the last release of each minor version, and of every other release the names that differ from those
    for version, modules in [*SNAPSHOT["versions"].items(), *SNAPSHOT["between"].items()]:
        for art_module, names in modules.items():
            path = groupwise_path(art_module)
            try:
                module = importlib.import_module(path)
            except MissingDependencyError:
                continue  # it exists, but its optional extra is not installed here: nothing to inspect
            except ModuleNotFoundError as err:
                if not path.startswith(str(err.name)):
                    raise  # the module exists but fails to import: that is a bug, not a difference
                diff.add(art_module, "missing module", f"{len(names)} names", version)
                continue
            for name, fact in names.items():
                diff.name(module, art_module, name, fact, version)
    return diff.found


def documented() -> dict[tuple[str, str], str]:
    """The rows of the "Checked differences" table: (`ART path`, difference) -> reason."""
    text = DOC.read_text()
    section = text.split("## Checked differences", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*([a-z ]+?)\s*\|\s*(.*?)\s*\|\s*$", line)
        if m:
            rows[(m.group(1), m.group(2))] = m.group(3)
    return rows


def test_the_snapshot_covers_every_minor_version_and_the_public_modules():
    assert list(SNAPSHOT["versions"]) == ["0.1.25", "0.2.0", "0.3.13", "0.4.12", "0.5.18"]
    latest = SNAPSHOT["versions"]["0.5.18"]
    assert {"art", "art.dev", "art.local", "art.rewards", "art.utils", "art.langgraph", "art.mcp"} <= set(latest)
    assert latest["art"]["Model"]["flavour"] == "pydantic" and "log" in latest["art"]["Model"]["methods"]
    assert [p["name"] for p in latest["art.utils"]["iterate_dataset"]["params"]][0] == "dataset"
    # every release from 0.3.0 to the newest was read: the ones between the anchors keep what differs
    assert SNAPSHOT["newest"] == "0.5.18"
    assert {"0.3.0", "0.3.6", "0.4.0", "0.5.9", "0.5.17"} <= set(SNAPSHOT["between"])


def test_every_difference_from_arts_api_is_documented_with_its_reason():
    found = differences()
    rows = documented()
    undocumented = {k: v for k, v in found.items() if k not in rows}
    stale = sorted(k for k in rows if k not in found)
    empty = sorted(k for k, reason in rows.items() if len(reason) < 10)
    message = "\n".join(
        [f"| `{path}` | {what} | ... |   <- {'; '.join(details)}" for (path, what), details in sorted(undocumented.items())]
        + [f"stale row (no longer a difference): `{path}` | {what}" for path, what in stale]
        + [f"row without a reason: `{path}` | {what}" for path, what in empty])
    assert not undocumented and not stale and not empty, (
        "groupwise's API differs from ART's where docs/porting-from-art.md does not say so (Checked differences):\n"
        + message)


def test_arts_training_options_are_all_known_and_arts_defaults_change_nothing():
    import warnings

    from groupwise import ArtCompatWarning, TrainConfig
    from groupwise.core.compat import KNOWN_TRAIN_OPTIONS, train_config_from_art

    ours = {f.name for f in dataclasses.fields(TrainConfig)}
    for version, modules in SNAPSHOT["versions"].items():
        # `_config` keys (art.dev.TrainConfig) and ART 0.5's `backend.train` keywords: each maps or is named
        options = set(modules["art.dev"]["TrainConfig"]["fields"])
        local = modules["art.local"].get("LocalBackend") or modules["art.local"]["LocalAPI"]  # ART 0.1-0.2's name
        train = local["methods"].get("train")
        spelled = {p["name"]: literal(p["default"]) for p in (train or {}).get("params", []) if p["kind"] == "keyword_only"}
        assert not (options | set(spelled)) - KNOWN_TRAIN_OPTIONS - ours, version
        if not spelled:
            continue
        # a program passing every option at ART's default (as ART 0.5's signature spells them) gets no
        # warning: nothing it asked for is lost; the ones that map take ART's values
        with warnings.catch_warnings():
            warnings.simplefilter("error", ArtCompatWarning)
            config = train_config_from_art(None, spelled, where=f"ART {version} defaults")
        assert (config.learning_rate, config.loss, config.scale_rewards, config.kl_coef, config.logprob_chunk_size) == (
            spelled["learning_rate"], spelled["loss_fn"], spelled["normalize_advantages"], spelled["kl_penalty_coef"],
            spelled["logprob_calculation_chunk_size"])
        assert config.epsilon == TrainConfig().epsilon  # ART's epsilon=None: not given


def test_every_missing_name_says_why_when_a_program_reaches_it():
    """A name ART has and groupwise does not (a `missing` row of the table) is an `ArtNameNotProvided`
    with the reason, not a bare AttributeError: on a module, and on an instance for a class's member."""
    from groupwise.errors import ArtNameNotProvided

    checked = 0
    for (path, what) in documented():
        if what not in ("missing", "missing field") or "(" in path:
            continue  # a parameter: a call with it names it (ConfigError / TypeError)
        module_path, _, name = path.rpartition(".")
        try:
            owner: Any = importlib.import_module(groupwise_path(module_path))
        except ModuleNotFoundError:
            owner_module, _, cls = module_path.rpartition(".")
            klass = getattr(importlib.import_module(groupwise_path(owner_module)), cls)
            if not hasattr(klass, "__getattr__") or issubclass(klass, __import__("pydantic").BaseModel):
                continue  # a pydantic record's field (Trajectory.start_time): its own row says what happens
            owner = klass.__new__(klass)
        try:
            getattr(owner, name)
        except ArtNameNotProvided as err:
            assert "groupwise" in str(err) and len(str(err)) > 60, str(err)
            if inspect.ismodule(owner):  # a module's missing name: the error names the path the program wrote
                assert str(err).startswith(f"{path} is not provided"), str(err)
            checked += 1
        else:
            raise AssertionError(f"{path} is documented missing but exists")
    assert checked >= 12
