"""Write tests/art_compat/art_api_snapshot.json: facts about the public API of OpenPipe ART's released
wheels, which tests/art_compat/test_art_api.py compares with groupwise's.

    python scripts/art_api_snapshot.py                     # downloads the wheels with pip
    python scripts/art_api_snapshot.py --wheels DIR        # or reads openpipe_art-*.whl from DIR (and
                                                           # downloads there the ones it lacks)

The wheels are read as text and parsed with `ast`; ART is never imported (it needs torch, vLLM,
Unsloth). The snapshot holds facts only: which modules and names are public, and for each public
function, class and method its parameters (name, kind, default as source text), and for pydantic
models, dataclasses and TypedDicts their fields. It is committed, so the test needs no network.

Public modules (PUBLIC_MODULES): `art` and the subpackages ART's docs and examples import from
(dev, local, rewards, utils, langgraph, mcp), `art.types` (imported directly in ART's examples),
the deep paths the porting doc promises (`art.local.backend`, `art.utils.iterate_dataset`), and the
helper modules ART's examples and docs import by path (`art.utils.litellm` in ART-E, `art.utils.sft`
in the SFT docs, the benchmarking helpers and charts in its benchmark notebooks, `art.skypilot` in its
cluster examples, `art.metrics` in the metrics docs, `art.utils.trajectory_logging`, `art.utils.deployment`).
ART's backends for other machinery (serverless, tinker, megatron, vllm) are not: groupwise does not
provide them, and their top-level names (`art.ServerlessBackend`) are facts of `art`.
A package's names are its ``__all__`` (else what its ``__init__`` imports); a plain module's are the
public names it defines.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "art_compat" / "art_api_snapshot.json"
# The last release of each minor version on PyPI when the snapshot was taken (0.1-0.2: the LocalAPI era,
# whose programs are still about).
VERSIONS = ("0.1.25", "0.2.0", "0.3.13", "0.4.12", "0.5.18")
# Every other release from 0.3.0 (ART's LocalBackend) to the newest: a name, parameter or field that one
# of them had and none of VERSIONS has (added, then renamed or dropped) is still in programs written
# then. The snapshot keeps, for each, only the names whose facts differ from every one of VERSIONS'.
BETWEEN = ("0.3.0", "0.3.1", "0.3.2", "0.3.3", "0.3.4", "0.3.5", "0.3.6", "0.3.9", "0.3.10", "0.3.11",
           "0.3.11.post5", "0.3.12", "0.4.0", "0.4.1", "0.4.2", "0.4.3", "0.4.4", "0.4.5", "0.4.7", "0.4.8",
           "0.4.9", "0.4.10", "0.4.11", "0.5.0", "0.5.1", "0.5.2", "0.5.3", "0.5.4", "0.5.5", "0.5.6", "0.5.7",
           "0.5.9", "0.5.10", "0.5.11", "0.5.16", "0.5.17")
PUBLIC_MODULES = ("art", "art.dev", "art.local", "art.local.backend", "art.rewards", "art.types", "art.utils",
                  "art.utils.iterate_dataset", "art.utils.litellm", "art.utils.sft", "art.langgraph", "art.mcp",
                  # imported by path in ART's notebooks, docs and examples (counted over its history)
                  "art.metrics", "art.skypilot", "art.utils.get_repo_root_path", "art.utils.benchmark_rollout",
                  "art.utils.benchmarking.types", "art.utils.benchmarking.load_trajectories",
                  "art.utils.benchmarking.charts", "art.utils.benchmarking.filter_model_split",
                  "art.utils.old_benchmarking.types", "art.utils.trajectory_logging", "art.utils.deployment")
PARAM_KINDS = {"posonly": "positional_only", "args": "positional_or_keyword", "kwonly": "keyword_only"}


class Package:
    """The `art` package of one wheel: module path -> parsed source."""

    def __init__(self, wheel: Path) -> None:
        self.trees: dict[str, ast.Module] = {}
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.startswith("art/") and name.endswith(".py"):
                    module = name[:-3].replace("/", ".").removesuffix(".__init__")
                    self.trees[module] = ast.parse(z.read(name).decode(), filename=name)

    def is_package(self, module: str) -> bool:
        return any(m.startswith(module + ".") for m in self.trees)

    def resolve(self, module: str, level: int, target: str | None) -> str:
        """The absolute module of a ``from <dots><target> import`` in `module`."""
        if level == 0:
            return target or ""
        base = module.split(".")
        base = base if self.is_package(module) else base[:-1]
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([target] if target else []))

    def definition(self, module: str, name: str, seen: int = 0) -> tuple[str, ast.AST | None]:
        """(module, node) where `name` of `module` is defined: a def, class or assignment, or the
        module itself (``from . import dev``); node None if not found (e.g. only in ``__all__``)."""
        tree = self.trees.get(module)
        if tree is None or seen > 20:
            return module, None
        found: ast.AST | None = None
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
                if not _is_overload(node):
                    found = node
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = node
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                found = node
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        source = self.resolve(module, node.level, node.module)
                        where, defined = self.definition(source, alias.name, seen + 1)
                        if defined is None and f"{source}.{alias.name}" in self.trees:  # a submodule
                            return f"{source}.{alias.name}", ast.Module(body=[], type_ignores=[])
                        if source.split(".")[0] == "art":
                            return where, defined
        return module, found

    def exported(self, module: str) -> list[str]:
        tree = self.trees[module]
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                return sorted(ast.literal_eval(node.value))
        names: set[str] = set()
        for node in tree.body:
            if self.is_package(module) and isinstance(node, ast.ImportFrom) and node.level > 0:
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign) and not isinstance(node.value, ast.Call):  # not T = TypeVar(...), logger
                names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        return sorted(n for n in names if not n.startswith("_"))


def _is_overload(node: ast.AST) -> bool:
    return any(ast.unparse(d).split(".")[-1] == "overload" for d in getattr(node, "decorator_list", []))


def params(fn: ast.FunctionDef | ast.AsyncFunctionDef, *, drop_first: bool) -> list[dict[str, Any]]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out: list[dict[str, Any]] = []
    for arg, default in zip(positional, defaults):
        kind = "positional_only" if arg in a.posonlyargs else "positional_or_keyword"
        out.append(_param(arg.arg, kind, default))
    if a.vararg:
        out.append(_param(a.vararg.arg, "var_positional", None))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append(_param(arg.arg, "keyword_only", default))
    if a.kwarg:
        out.append(_param(a.kwarg.arg, "var_keyword", None))
    return out[1:] if drop_first and out and out[0]["kind"] != "keyword_only" else out


def _param(name: str, kind: str, default: ast.AST | None) -> dict[str, Any]:
    p: dict[str, Any] = {"name": name, "kind": kind}
    if default is not None:
        p["default"] = ast.unparse(default)
    return p


class Facts:
    def __init__(self, package: Package) -> None:
        self.p = package

    def name(self, module: str, name: str) -> dict[str, Any]:
        where, node = self.p.definition(module, name)
        if node is None:
            return {"kind": "unresolved"}  # e.g. in ART 0.5.18's __all__ but never imported
        if isinstance(node, ast.Module):
            return {"kind": "module", "module": where}
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return {"kind": "function", "async": isinstance(node, ast.AsyncFunctionDef),
                    "params": params(node, drop_first=False)}
        if isinstance(node, ast.ClassDef):
            return self.cls(where, node)
        return {"kind": "value"}

    def bases(self, module: str, node: ast.ClassDef, depth: int = 0) -> list[tuple[str, ast.ClassDef | str]]:
        """The class's ancestors, nearest first: ART classes as nodes, others by their name."""
        out: list[tuple[str, ast.ClassDef | str]] = []
        for base in node.bases:
            expr = base.value if isinstance(base, ast.Subscript) else base
            label = ast.unparse(expr)
            if label in ("Generic", "typing.Generic", "object"):
                continue
            where, found = self.p.definition(module, label.split(".")[-1])
            if isinstance(found, ast.ClassDef) and found is not node and depth < 10:
                out.append((where, found))
                out.extend(self.bases(where, found, depth + 1))
            else:
                out.append((module, label.split(".")[-1]))
        return out

    def cls(self, module: str, node: ast.ClassDef) -> dict[str, Any]:
        chain = [(module, node), *self.bases(module, node)]
        external = {b for _, b in chain if isinstance(b, str)}
        flavour = ("pydantic" if "BaseModel" in external else "typeddict" if "TypedDict" in external
                   else "enum" if external & {"Enum", "IntEnum", "StrEnum"} else
                   "dataclass" if any(ast.unparse(d).split("(")[0].endswith("dataclass") for _, n in chain
                                      if isinstance(n, ast.ClassDef) for d in n.decorator_list) else "class")
        fields: dict[str, Any] = {}
        methods: dict[str, Any] = {}
        init: list[dict[str, Any]] | None = None
        for _, klass in reversed([c for c in chain if isinstance(c[1], ast.ClassDef)]):  # base first
            for item in klass.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if not item.target.id.startswith("_") and "ClassVar" not in ast.unparse(item.annotation):
                        fields[item.target.id] = None if item.value is None else ast.unparse(item.value)
                elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not _is_overload(item):
                    decorators = {ast.unparse(d).split("(")[0].split(".")[-1] for d in item.decorator_list}
                    if item.name == "__init__":
                        init = params(item, drop_first=True)
                    elif not item.name.startswith("_"):
                        kind = ("property" if decorators & {"property", "cached_property"} or
                                any(d.endswith(("setter", "getter")) for d in decorators) else "method")
                        entry: dict[str, Any] = {"kind": kind}
                        if kind == "method":  # an @asynccontextmanager is called without await
                            entry["async"] = (isinstance(item, ast.AsyncFunctionDef)
                                              and not decorators & {"asynccontextmanager", "contextmanager"})
                            entry["params"] = params(item, drop_first="staticmethod" not in decorators)
                        methods[item.name] = entry
        facts: dict[str, Any] = {"kind": "class", "flavour": flavour}
        if flavour in ("pydantic", "dataclass", "typeddict"):
            facts["fields"] = fields
        if init is None and flavour in ("pydantic", "dataclass"):  # their generated __init__
            init = [{"name": k, "kind": "keyword_only" if flavour == "pydantic" else "positional_or_keyword",
                     **({} if v is None else {"default": v})} for k, v in fields.items()]
        if init is not None and flavour != "typeddict":
            facts["init"] = init
        if flavour != "typeddict":
            facts["methods"] = methods
        return facts


def version_facts(wheel: Path) -> dict[str, Any]:
    package = Package(wheel)
    facts = Facts(package)
    modules: dict[str, Any] = {}
    for module in PUBLIC_MODULES:
        if module not in package.trees:
            continue
        modules[module] = {name: facts.name(module, name) for name in package.exported(module)}
    return modules


def snapshot(wheels: dict[str, Path], between: dict[str, Path] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"about": "Facts about OpenPipe ART's public API, read from its released wheels by "
                                    "scripts/art_api_snapshot.py; compared with groupwise by "
                                    "tests/art_compat/test_art_api.py. `versions`: every fact of the last "
                                    "release of each minor version; `between`: of the other releases, the "
                                    "names whose facts differ from all of those.",
                           "public_modules": list(PUBLIC_MODULES), "newest": list(wheels)[-1], "versions": {},
                           "between": {}}
    for version, wheel in wheels.items():
        out["versions"][version] = version_facts(wheel)
    for version, wheel in (between or {}).items():
        differing: dict[str, Any] = {}
        for module, names in version_facts(wheel).items():
            for name, fact in names.items():
                if all(modules.get(module, {}).get(name) != fact for modules in out["versions"].values()):
                    differing.setdefault(module, {})[name] = fact
        if differing:
            out["between"][version] = differing
    return out


def wheels_in(directory: Path, versions: tuple[str, ...]) -> dict[str, Path]:
    return {v: next(directory.glob(f"openpipe_art-{v}-*.whl")) for v in versions}


def download(directory: Path) -> None:
    for version in (*VERSIONS, *BETWEEN):
        if not any(directory.glob(f"openpipe_art-{version}-*.whl")):
            subprocess.run([sys.executable, "-m", "pip", "download", f"openpipe-art=={version}", "--no-deps", "-q",
                            "-d", str(directory)], check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, help="a folder holding openpipe_art-<version>-*.whl")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.wheels or Path(tmp)
        download(directory)  # the ones the folder lacks
        data = snapshot(wheels_in(directory, VERSIONS), wheels_in(directory, BETWEEN))
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}: " + ", ".join(
        f"{v} ({sum(len(m) for m in mods.values())} names)" for v, mods in data["versions"].items())
        + "; between them: " + ", ".join(f"{v} ({sum(len(m) for m in mods.values())} differing)"
                                         for v, mods in data["between"].items()))


if __name__ == "__main__":
    main()
