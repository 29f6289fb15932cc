"""The layer checker of src/groupwise: a scan of the import graph with `ast` and one function per rule.

tests/test_layers.py runs it on the real tree and on synthetic trees with one deliberate break each.

The rules (`RULES` below holds the layer ones):
- the client side (what `import groupwise` and its public names load, see `client_roots`) imports no
  optional-extra library (torch, transformers, peft, fastapi, ... read from pyproject.toml) at module level;
- judge/ never imports inference/, backend/ or training/: it receives a client;
- training/ never imports inference/, and inference/ never imports training/;
- chat/ (how a conversation becomes the prompt's text and tokens) imports none of inference/, training/,
  backend/ or loop/: server and trainer both render with it, so it sits below both;
- loop/ never imports backend/, inference/ or training/, except `groupwise.backend.base`: the loop speaks
  to a backend only through the public `Backend` contract that base.py defines (base.py itself imports
  nothing heavy and no other backend module, which is checked too);
- envs/ never imports training/, backend/ or jobs/ (an env is its contract: data and a rollout, not a job);
- dashboard/ never imports inference/, backend/, training/ (but the pure `training.advantages`) or jobs/:
  it reads the run store and loads no model;
- the readers of a run (`RUN_READERS`: dashboard/, judge/, runs/report.py, runs/transcript.py,
  runs/compare.py, jobs/report.py, jobs/inspect.py) import none of the modules that open a run folder's
  files (`RUN_STORE_FILES`: runs/store.py, runs/history.py, runs/lock.py): they read through runs/view.py;
- jobs/ are the top floor under the CLI: only `groupwise.cli` (and jobs themselves) import them; nothing
  imports cli; the CLI imports its jobs by name, never through `importlib` (so the import graph shows
  which job each command runs);
- no module but the CLI imports `argparse`: a domain module takes typed arguments, never a Namespace;
- no module imports another module's private name: `from m import _x`, or `m._x` on an imported
  groupwise module. A private module (`_chat.py`) is private to its package: modules of that package may
  import it and its public names;
- no module reads a private member (``obj._x``, ``getattr(obj, "_x")``) that a class of another
  groupwise module defines: helpers of a class take an explicit object with public fields instead
  (the engine's step modules take `StepState` and `ModelRunner`);
- no import cycles.

How imports are counted:
- Layer and private-name rules see every import: module level, inside functions, under `TYPE_CHECKING`.
  A dependency is a dependency wherever the import statement sits.
- The heavy-library rule sees only imports that run when the module loads: module level (a class body
  counts), not inside a function and not under `if TYPE_CHECKING:`. A function-level import is how the
  client side reaches torch lazily, when a backend builds its engine or trainer.
- The cycle rule sees every import that runs: module level and function level, not `TYPE_CHECKING`
  (annotations only, never executed). A function-level import keeps a cycle from failing at load, but
  the two modules still depend on each other; that is the tangle the rule exists to prevent.
- Importing `a.b.c` also runs the packages `a.b` and `a`; those implicit edges count for cycles except
  towards the importer's own parent packages, which Python always initialises first (an explicit
  `from a.b import x` in `a.b.c` does count: it needs `a.b` to have finished).
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, field
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
PACKAGE = "groupwise"


# ---------------------------------------------------------------------------------------------- scan


@dataclass(frozen=True)
class Import:
    importer: str  # module doing the import
    target: str  # the module imported (deepest one that exists in the tree, or the external name)
    names: tuple[str, ...]  # names taken by `from target import ...` (empty for `import x`)
    line: int
    in_function: bool  # inside a function body: runs when the function is called
    type_only: bool  # under `if TYPE_CHECKING:`: never runs

    @property
    def at_load(self) -> bool:
        return not self.in_function and not self.type_only


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: list[Import] = field(default_factory=list)
    private_attrs: list[tuple[str, str, int]] = field(default_factory=list)  # (module, attr, line)
    defines: set[str] = field(default_factory=set)  # private members its classes define (self._x, def _x)
    reads: list[tuple[str, int]] = field(default_factory=list)  # obj._x with obj not self/cls: (attr, line)


def module_name(root: Path, path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _resolve_relative(mod: Module, level: int, name: str | None) -> str:
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{name}" if name else package


class _Visitor(ast.NodeVisitor):
    def __init__(self, mod: Module, known: set[str]) -> None:
        self.mod = mod
        self.known = known
        self.depth = 0  # inside a function
        self.type_checking = 0
        self.aliases: dict[str, str] = {}  # local name -> groupwise module it is bound to

    def _deepest(self, dotted: str) -> str:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in self.known:
                return ".".join(parts[:n])
        return dotted

    def _add(self, target: str, names: tuple[str, ...], line: int) -> None:
        self.mod.imports.append(Import(self.mod.name, target, names, line, self.depth > 0, self.type_checking > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(self._deepest(alias.name), (), node.lineno)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:  # `import a.b.c` binds `a`; attribute chains are resolved against the full name
                self.aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve_relative(self.mod, node.level, node.module) if node.level else node.module or ""
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in self.known:  # `from pkg import submodule`
                self._add(sub, (), node.lineno)
                self.aliases[alias.asname or alias.name] = sub
            else:
                self._add(self._deepest(base), (alias.name,), node.lineno)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.type_checking += 1
            for stmt in node.body:
                self.visit(stmt)
            self.type_checking -= 1
            for stmt in node.orelse:
                self.visit(stmt)
        else:
            self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for stmt in node.body:
            names = [stmt.name] if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) else [
                t.id for t in getattr(stmt, "targets", [getattr(stmt, "target", None)]) if isinstance(t, ast.Name)]
            self.mod.defines.update(n for n in names if _private(n))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        # getattr(obj, "_x"), setattr(obj, "_x", v), hasattr(obj, "_x"): a private read spelled as a string
        if (isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str) and _private(node.args[1].value)
                and not (isinstance(node.args[0], ast.Name) and node.args[0].id in ("self", "cls"))):
            self.mod.reads.append((node.args[1].value, node.lineno))
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                if isinstance(node.ctx, ast.Store):
                    self.mod.defines.add(node.attr)
            elif not (isinstance(node.value, ast.Name) and node.value.id in self.aliases):
                self.mod.reads.append((node.attr, node.lineno))
        chain: list[str] = [node.attr]
        value = node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.aliases:
            dotted = [self.aliases[value.id], *reversed(chain)]
            # walk the chain while it names modules; the first non-module part is an attribute of one
            module = dotted[0]
            for part in dotted[1:]:
                if f"{module}.{part}" in self.known:
                    module = f"{module}.{part}"
                    continue
                if module in self.known and _private(part):
                    self.mod.private_attrs.append((module, part, node.lineno))
                break
        self.generic_visit(node)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def scan(root: Path, package: str = PACKAGE) -> dict[str, Module]:
    """Every module under root/package, with its imports."""
    modules: dict[str, Module] = {}
    for path in sorted((root / package).rglob("*.py")):
        name, is_package = module_name(root, path)
        modules[name] = Module(name, path, is_package)
    known = set(modules)
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text(), filename=str(mod.path))
        _Visitor(mod, known).visit(tree)
    return modules


# ---------------------------------------------------------------------------------------------- rules


def within(module: str, area: str) -> bool:
    return module == area or module.startswith(area + ".")


@dataclass(frozen=True)
class Rule:
    importers: str  # the area the rule binds (a module or package, with everything under it)
    forbidden: tuple[str, ...]  # areas it must not import
    why: str
    allowed: tuple[str, ...] = ()  # targets inside `forbidden` that stay allowed
    exempt: tuple[str, ...] = ()  # importers inside `importers` the rule does not bind
    exempt_exact: tuple[str, ...] = ()  # single modules it does not bind (the package's __init__, say)


# The modules that open a run folder's files (history.jsonl, the trajectory files, the writer lock), and the
# readers of a run, which reach them only through `groupwise.runs.view`.
RUN_STORE_FILES = ("groupwise.runs.store", "groupwise.runs.history", "groupwise.runs.lock")
RUN_READERS = ("groupwise.dashboard", "groupwise.judge", "groupwise.runs.report", "groupwise.runs.transcript",
               "groupwise.runs.compare", "groupwise.jobs.report", "groupwise.jobs.inspect")

RULES = [
    Rule("groupwise.judge", ("groupwise.inference", "groupwise.backend", "groupwise.training"),
         "the judge receives a client; a local judge is built by the backend"),
    # A run folder is read through one view (runs/view.py), so every reader names the same metric and steps.
    Rule("groupwise.judge", ("groupwise.runs",), "the judge reads a run through the run-reading view (runs/view.py)",
         allowed=("groupwise.runs.view",)),
    # Every reader of a run folder (report, inspect, compare, the judge's labelled sets, the dashboard) reads
    # it through that view and opens none of the store's files itself: a change of layout is made once.
    *(Rule(reader, RUN_STORE_FILES, "a reader of a run reads it through the run-reading view (runs/view.py), "
                                    "never the run store's files")
      for reader in RUN_READERS),
    Rule("groupwise.training", ("groupwise.inference",), "training and inference are separate layers"),
    Rule("groupwise.inference", ("groupwise.training",), "training and inference are separate layers"),
    Rule("groupwise.chat", ("groupwise.inference", "groupwise.training", "groupwise.backend", "groupwise.loop"),
         "the chat layer is below both server and trainer: both render conversations with it"),
    Rule("groupwise.loop", ("groupwise.backend", "groupwise.inference", "groupwise.training"),
         "the loop speaks to a backend only through the public Backend contract",
         allowed=("groupwise.backend.base",)),
    Rule("groupwise.backend.base", ("groupwise.backend", "groupwise.inference", "groupwise.training"),
         "the Backend contract stands alone, so the loop may import it", allowed=("groupwise.backend.base",)),
    Rule("groupwise.envs", ("groupwise.training", "groupwise.backend", "groupwise.jobs"),
         "an env is its contract, tasks and a rollout; jobs that compose backends live in jobs/"),
    # ART's integrations (art.langgraph, art.mcp) are client code that a user's rollout calls: they reach a
    # model only through its OpenAI-compatible endpoint, as any agent framework would.
    *(Rule(area, ("groupwise.inference", "groupwise.backend", "groupwise.training", "groupwise.loop"),
           "an integration reaches the model through its OpenAI-compatible endpoint, as agent code does")
      for area in ("groupwise.langgraph", "groupwise.mcp")),
    # The dashboard reads the run store and loads no model: no torch, and it never disturbs a training run.
    # Group advantages are pure Python (training/advantages.py), shared so the page shows what GRPO used.
    Rule("groupwise.dashboard", ("groupwise.inference", "groupwise.backend", "groupwise.training", "groupwise.jobs"),
         "the dashboard is a reader of the run store; it loads no model",
         allowed=("groupwise.core.advantages",)),
    # The folders are the layer map. ART's paths are a wing over the core (groupwise/art/): the wing imports
    # the core, never the reverse; a user reaches the wing at ART's paths through groupwise.art.aliases.
    Rule("groupwise", ("groupwise.art",), "ART's paths are a wing over the core: dependencies run wing -> core only",
         exempt=("groupwise.art",), exempt_exact=("groupwise",)),
    # core/: the data model and what every layer shares (no torch); runs/: the run store and its readers'
    # parts; runtime/: the torch-side helpers of the engine and the trainer.
    Rule("groupwise.core", ("groupwise.runs", "groupwise.runtime", "groupwise.rollout", "groupwise.loop", "groupwise.backend", "groupwise.inference", "groupwise.training", "groupwise.jobs", "groupwise.dashboard", "groupwise.envs", "groupwise.judge", "groupwise.model"),
         "the core is the floor every layer stands on: it imports none of them"),
    Rule("groupwise.runs", ("groupwise.runtime", "groupwise.rollout", "groupwise.loop", "groupwise.backend", "groupwise.inference", "groupwise.training", "groupwise.jobs", "groupwise.dashboard", "groupwise.envs", "groupwise.judge", "groupwise.model"),
         "the run store is read and written by the layers above it and imports none of them"),
    Rule("groupwise.runtime", ("groupwise.core", "groupwise.runs", "groupwise.chat", "groupwise.rollout", "groupwise.loop", "groupwise.backend", "groupwise.inference", "groupwise.training", "groupwise.jobs", "groupwise.dashboard", "groupwise.envs", "groupwise.judge", "groupwise.model"),
         "torch-side helpers serve the engine and the trainer, below both"),
    *(Rule(area, ("groupwise.runtime",), "the client side never needs the torch-side helpers")
      for area in ("groupwise.core", "groupwise.runs", "groupwise.rollout", "groupwise.judge", "groupwise.loop",
                   "groupwise.dashboard", "groupwise.chat", "groupwise.envs")),
    Rule("groupwise", ("groupwise.jobs",), "jobs are the top floor: only the CLI runs them",
         exempt=("groupwise.jobs", "groupwise.cli")),
    Rule("groupwise", ("groupwise.cli",), "nothing imports the CLI but `python -m groupwise`, which is it",
         exempt=("groupwise.cli", "groupwise.__main__")),
    Rule("groupwise.cli", ("importlib",), "the CLI imports its jobs by name, so the import graph shows them"),
    Rule("groupwise", ("argparse",), "only the CLI parses a command line: a domain module takes typed arguments",
         exempt=("groupwise.cli",)),
]


def layer_violations(modules: dict[str, Module], rules: list[Rule] = RULES) -> list[str]:
    found = []
    for mod in modules.values():
        for rule in rules:
            if (not within(mod.name, rule.importers) or any(within(mod.name, e) for e in rule.exempt)
                    or mod.name in rule.exempt_exact):
                continue
            for imp in mod.imports:
                if any(within(imp.target, f) for f in rule.forbidden) and not any(
                    within(imp.target, a) for a in rule.allowed
                ):
                    found.append(f"{mod.name}:{imp.line} imports {imp.target}: {rule.why}")
    return found


def private_violations(modules: dict[str, Module], package: str = PACKAGE) -> list[str]:
    def owner_of_private_module(target: str) -> str | None:
        """The package a private module belongs to (`a.b._c` -> `a.b`), None for a public path."""
        parts = target.split(".")
        for n, part in enumerate(parts):
            if _private(part):
                return ".".join(parts[:n])
        return None

    found = []
    for mod in modules.values():
        for imp in mod.imports:
            if not within(imp.target, package):
                continue
            owner = owner_of_private_module(imp.target)
            if owner is not None and not within(mod.name, owner):
                found.append(f"{mod.name}:{imp.line} imports private module {imp.target}")
            for name in imp.names:
                if _private(name) and imp.target != mod.name:
                    found.append(f"{mod.name}:{imp.line} imports private {imp.target}.{name}")
        for target, attr, line in mod.private_attrs:
            if target != mod.name:
                found.append(f"{mod.name}:{line} reads private {target}.{attr}")
    return found


def private_member_violations(modules: dict[str, Module]) -> list[str]:
    """`obj._x` where `_x` is a private member that a class of ANOTHER groupwise module defines (and no
    class of this module does). Types are not inferred: a name defined both here and elsewhere passes,
    and a library's private (peft's `_active_adapter`) is not groupwise's to police."""
    owners: dict[str, set[str]] = {}
    for mod in modules.values():
        for name in mod.defines:
            owners.setdefault(name, set()).add(mod.name)
    found = []
    for mod in modules.values():
        for attr, line in mod.reads:
            others = owners.get(attr, set()) - {mod.name}
            if others and attr not in mod.defines:
                found.append(f"{mod.name}:{line} reads .{attr} of {', '.join(sorted(others))}")
    return found


def import_edges(modules: dict[str, Module], *, at_load_only: bool) -> dict[str, set[str]]:
    """importer -> modules it runs: when it loads, or (at_load_only=False) at any time it runs."""
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for mod in modules.values():
        own_parents = {mod.name.rsplit(".", n)[0] for n in range(1, mod.name.count(".") + 1)}
        for imp in mod.imports:
            if imp.type_only or (at_load_only and imp.in_function) or imp.target not in modules:
                continue
            if imp.target != mod.name:
                edges[mod.name].add(imp.target)
            parts = imp.target.split(".")
            for n in range(1, len(parts)):  # the packages that loading the target initialises
                package = ".".join(parts[:n])
                if package in modules and package not in own_parents:
                    edges[mod.name].add(package)
    return edges


def cycles(modules: dict[str, Module]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    edges = import_edges(modules, at_load_only=False)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return found


def heavy_libraries(pyproject: Path = REPO / "pyproject.toml") -> set[str]:
    """Import names of every library in an optional extra, except the test tools of `dev`."""
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    names = set()
    for extra, requirements in extras.items():
        if extra in ("dev", "all"):
            continue
        for requirement in requirements:
            name = requirement.split(";")[0].split("[")[0]
            for sep in "<>=!~ ":
                name = name.split(sep)[0]
            names.add(name.strip().replace("-", "_"))
    return names


def load_closure(modules: dict[str, Module], roots: set[str]) -> dict[str, list[str]]:
    """Every module that loading `roots` loads, with the chain of imports that reaches it."""
    edges = import_edges(modules, at_load_only=True)
    chains = {r: [r] for r in roots if r in modules}
    todo = sorted(chains)
    while todo:
        v = todo.pop()
        for w in sorted(edges[v]):
            if w not in chains:
                chains[w] = [*chains[v], w]
                todo.append(w)
    return chains


def heavy_violations(modules: dict[str, Module], roots: set[str], heavy: set[str]) -> list[str]:
    found = []
    for name, chain in sorted(load_closure(modules, roots).items()):
        for imp in modules[name].imports:
            top = imp.target.split(".")[0]
            if imp.at_load and top in heavy:
                found.append(f"{name}:{imp.line} imports {imp.target} at load (via {' -> '.join(chain)})")
    return found


def client_roots(modules: dict[str, Module], package: str = PACKAGE) -> set[str]:
    """`import groupwise`, every module a public name resolves to, its ART subpackages, and the CLI.

    The package resolves its public names lazily (`_EXPORTS` and `_SUBPACKAGES` in its __init__); each
    of those modules is something a user reaches with `gw.<name>`, so each must load without torch.
    Torch arrives when a backend builds its engine or trainer, through function-level imports.
    """
    init = modules[package].path
    exports: set[str] = set()
    for node in ast.walk(ast.parse(init.read_text())):
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if not isinstance(target, ast.Name) or not isinstance(node.value, ast.Dict | ast.Tuple):
            continue
        if target.id == "_EXPORTS":
            exports |= {ast.literal_eval(v) for v in node.value.values}
        elif target.id == "_SUBPACKAGES":
            exports |= {f"{package}.art.{ast.literal_eval(v)}" for v in node.value.elts}
    # groupwise.mcp is imported by its path (`from art.mcp import ...`) and needs nothing beyond openai;
    # groupwise.langgraph is the one integration that loads its extra (LangChain) on import, by design.
    return {package, f"{package}.cli", f"{package}.runs.transcript", f"{package}.mcp", *exports}


def alias_violations(modules: dict[str, Module]) -> list[str]:
    """Imports inside the package of a module by an old path (ART's, or groupwise's own before the folders
    were the layer map): they load through groupwise.art.aliases, so the import graph would not show the
    real dependency. Strings that name such a path (``importlib.import_module("groupwise.store")``, a lazy
    export table) count too."""
    from groupwise.art.aliases import new_path

    found = []
    for mod in modules.values():
        for node in ast.walk(ast.parse(mod.path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value.startswith(PACKAGE + ".") and node.value.replace(".", "").replace("_", "").isalnum() else []
            for name in names:
                new = new_path(name)
                if new is not None and not (isinstance(node, ast.ImportFrom) and name != node.module
                                            and new_path(node.module) is None):
                    found.append(f"{mod.name}:{node.lineno} names {name}: import {new}")
                    break
    return found
