"""Runs ART's own programs (vendored byte for byte under art_repo/) with `import groupwise as art`.

What a run changes, and nothing else:

- **the import**: `import art` -> `import groupwise as art`, `from art.x import` -> `from groupwise.x import`
  (every file of the program, its helper modules included);
- **the data**: each program lists exact substitutions that shrink loop counts, group sizes and data
  sets (each must match the stated number of times, so a listed change cannot silently stop applying);
- **seams**, outside the program text: ART's Hugging Face model ids resolve to the tiny random model
  (a folder named like the id in the working directory, which `from_pretrained` reads as a local
  path); `weave` and `openpipe` (observability services) are no-op stand-ins from `seams/` when not
  installed; `sys.argv` is the program's name alone. External services a program reaches are
  stood in for by local ones with the same interface: a Hugging Face hub data set by the `datasets`
  stand-in in `seams/` (the test registers shrunk rows in the hub's columns), an HTTP service whose
  URL the program reads from an environment variable (ART's Modal-hosted reward model) by a local
  HTTP server answering the same JSON, a hosted model an `openai` client is pointed at (o4-mini at
  api.openai.com) by a groupwise server of the tiny model under the hosted model's name.

Scripts run as `python path/to/script.py` does (`__main__`, their folder on sys.path) from the root of
a copy of ART's repository; notebooks run their code cells in order in one event loop with top-level
`await`, as Jupyter does (line magics and `!` shell lines are skipped, `%%html` cells too).

Programs run in the test process (torch and the tokenizer are loaded once for all of them); every
LocalBackend a program opened is closed afterwards, and the modules it imported from its own folder
are forgotten, since ART's examples reuse module names (`rollout`, `utils`).
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import inspect
import os
import re
import runpy
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ART_REPO = Path(__file__).parent / "art_repo"
SEAMS = Path(__file__).parent / "seams"
ART_COMMIT = "779559fd0c68ce073cbd041447f88aacf1d9f585"  # OpenPipe/ART, 2025-06-14, version 0.3.11
CELL_MARK = "\n# %% [code cell]\n"

_IMPORT_RES = [
    (re.compile(r"^(\s*)import art$", re.M), r"\1import groupwise as art"),
    (re.compile(r"^(\s*)from art(\.[\w.]+)? import ", re.M), r"\1from groupwise\2 import "),
]


_SUBMODULE_IMPORT = re.compile(r"^\s*import art(\.[\w.]+)$", re.M)


def port(text: str) -> str:
    """The one change an ART program needs: the package's name. ``import art.x.y`` binds the name
    ``art.x.y`` the program then uses, so both become ``groupwise.x.y``."""
    for submodule in set(_SUBMODULE_IMPORT.findall(text)):
        text = re.sub(rf"\bart{re.escape(submodule)}\b", f"groupwise{submodule}", text)
    for pattern, repl in _IMPORT_RES:
        text = pattern.sub(repl, text)
    # `import asyncio, art`: the one name among others
    text = re.sub(r"^(\s*import (?:[\w.]+ *, *)+)art\b(?!\.)|^(\s*import )art( *,)", lambda m: (m[1] or m[2])
                  + "groupwise as art" + (m[3] or ""), text, flags=re.M)
    assert not re.search(r"^\s*(import art\b|from art\b|import [\w., ]*(?<!as )\bart\b(?!\.| as))", text, re.M), \
        "an ART import was left unported"
    return text


@dataclass
class Program:
    entry: str  # path in ART's repository; notebooks end in .ipynb
    helpers: tuple[str, ...] = ()  # other files of the program (modules, data)
    shrink: dict[str, list[tuple[str, str, int]]] = field(default_factory=dict)  # file -> (old, new, count)
    base_models: tuple[str, ...] = ()
    extra_files: dict[str, str] = field(default_factory=dict)  # path -> text: shrunk data ART's repo lacks
    skip_cells: dict[int, str] = field(default_factory=dict)  # notebook cell index -> why it is not run
    downloads: dict[str, str] = field(default_factory=dict)  # URL `requests.get` fetches -> path in root
    env: dict[str, str] = field(default_factory=dict)  # environment variables the program reads
    # folders of the program put on sys.path, as installing its package (`uv run` in its folder) does
    package_roots: tuple[str, ...] = ()
    hub: dict[tuple[str, str], list[dict]] = field(default_factory=dict)  # (repo id, split) -> rows
    # environment variable -> handler of the JSON a program POSTs to the URL that variable names
    services: dict[str, Callable[[dict], dict]] = field(default_factory=dict)
    # the package a module of ART's own package runs in (its `from . import` then reaches groupwise's
    # counterpart), as `python -m art.<package>.<module>` runs it; None: a script
    package: str | None = None
    # module -> seam standing in for it: an ART module of an external service (e.g. Tinker's backend)
    modules: dict[str, str] = field(default_factory=dict)
    # base URL an `openai` client is given (a hosted model, e.g. o4-mini at api.openai.com) -> the
    # local OpenAI-compatible endpoint standing in for it, or (endpoint, its API key)
    endpoints: dict[str, str | tuple[str, str]] = field(default_factory=dict)
    # a program that fails in ART as well, before or at its first step: (exception class, message part)
    fails_in_art: tuple[str, str] | None = None
    # a program that fails here by a deliberate difference (docs/porting-from-art.md says which)
    fails_here: tuple[str, str] | None = None
    # where the program's files are kept: ART's repository, or a folder of the third-party corpus
    root: Path = ART_REPO
    argv: tuple[str, ...] = ()  # the program's command-line arguments (`--model run_1`)

    @property
    def notebook(self) -> bool:
        return self.entry.endswith(".ipynb")

    def stored(self, path: str) -> Path:
        return self.root / (path + ".py" if path.endswith(".ipynb") else path)


def materialise(program: Program, root: Path) -> Path:
    """Writes the program (ported, shrunk) into root laid out as ART's repository; returns the entry."""
    for path in (program.entry, *program.helpers):
        text = program.stored(path).read_text()
        if path.endswith((".py", ".ipynb")):
            text = port(text)
        for old, new, count in program.shrink.get(path, []):
            found = text.count(old)
            assert found == count, f"{path}: shrink {old!r} matched {found} times, expected {count}"
            text = text.replace(old, new)
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for path, text in program.extra_files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    unused = set(program.shrink) - {program.entry, *program.helpers}
    assert not unused, f"shrinks for files the program does not have: {unused}"
    return root / program.entry


def _cells(source: str, skip: dict[int, str]) -> list[str]:
    cells = []
    for index, cell in enumerate(source.split(CELL_MARK)):
        if cell.lstrip().startswith("%%html") or index in skip:
            continue
        lines = [line for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))]
        cells.append("\n".join(lines))
    return cells


async def _run_cells(cells: list[str], filename: str) -> dict:
    namespace: dict = {"__name__": "__main__"}
    for cell in cells:
        code = compile(cell, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        result = eval(code, namespace)  # noqa: S307 - the notebook's own code, as Jupyter runs it
        if inspect.iscoroutine(result):
            await result
    return namespace


def _serve_downloads(files: dict[str, Path]):
    """The seam for a notebook's downloads (no network here): `requests.get` of a listed URL answers
    with the file's text; any other URL goes to the real `requests.get`. Returns the undo."""
    if not files:
        return lambda: None
    import requests

    real_get = requests.get

    def get(url, *args, **kwargs):
        if url not in files:
            return real_get(url, *args, **kwargs)
        response = requests.Response()
        response.status_code, response.url, response.encoding = 200, url, "utf-8"
        response._content = files[url].read_bytes()
        return response

    requests.get = get

    def undo():
        requests.get = real_get

    return undo


def _serve_json(handler: Callable[[dict], dict]) -> tuple[str, Callable[[], None]]:
    """A local HTTP service answering every POST's JSON body with handler(body); returns (url, stop)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answer = json.dumps(handler(body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
        thread.join(10)

    return f"http://127.0.0.1:{server.server_address[1]}/score", stop


def _redirect_endpoints(endpoints: dict[str, str]) -> list[Callable[[], None]]:
    """`openai` clients built for a hosted endpoint reach its local stand-in instead."""
    import openai

    undo = []
    for cls in (openai.OpenAI, openai.AsyncOpenAI) if endpoints else ():
        original = cls.__init__

        def init(self, *args, _original=original, **kwargs):
            url = str(kwargs.get("base_url") or "").rstrip("/")
            if url in endpoints:
                target = endpoints[url]
                # (url, key): the stand-in's own key replaces the one the program has for the service
                kwargs["base_url"], kwargs["api_key"] = target if isinstance(target, tuple) else (target, kwargs.get("api_key"))
            _original(self, *args, **kwargs)

        cls.__init__ = init
        undo.append(lambda cls=cls, original=original: setattr(cls, "__init__", original))
    return undo


def run_program(program: Program, root: Path, tiny_model_dir: str) -> None:
    """Runs one ART program in root (a fresh folder) on the tiny model."""
    from groupwise.backend.local import LocalBackend

    entry = materialise(program, root)
    # Jupyter runs a notebook in its folder; ART's scripts open files relative to the repository root
    cwd = entry.parent if program.notebook else root
    for model_id in program.base_models:
        (cwd / model_id).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(tiny_model_dir, cwd / model_id)
    opened: list = []
    original_init = LocalBackend.__init__

    def tracking_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        opened.append(self)

    saved = (os.getcwd(), list(sys.path), list(sys.argv), set(sys.modules), dict(os.environ))
    LocalBackend.__init__ = tracking_init
    undo_downloads = _serve_downloads({url: root / path for url, path in program.downloads.items()})
    stops = []
    try:
        os.chdir(cwd)
        sys.path[:0] = [str(entry.parent), *(str(root / p) for p in program.package_roots), str(SEAMS)]
        sys.argv = [str(entry), *program.argv]
        os.environ.update(program.env)
        for variable, handler in program.services.items():
            os.environ[variable], stop = _serve_json(handler)
            stops.append(stop)
        if program.hub:
            import datasets

            assert Path(datasets.__file__).parent == SEAMS, f"not the hub stand-in: {datasets.__file__}"
            datasets.HUB.update(program.hub)
        for name, seam in program.modules.items():
            sys.modules[name] = importlib.import_module(seam)
        stops.extend(_redirect_endpoints(program.endpoints))
        if program.notebook:
            asyncio.run(_run_cells(_cells(entry.read_text(), program.skip_cells), str(entry)))
        elif program.package:
            code = compile(entry.read_text(), str(entry), "exec", dont_inherit=True)
            exec(code, {"__name__": "__main__", "__file__": str(entry), "__package__": program.package})  # noqa: S102
        else:
            runpy.run_path(str(entry), run_name="__main__")
    finally:
        LocalBackend.__init__ = original_init
        undo_downloads()
        for stop in stops:
            stop()
        os.environ.clear()
        os.environ.update(saved[4])
        for backend in opened:
            backend.__exit__(None, None, None)
        if "wandb" in sys.modules:  # the program's process would end here, and W&B's settings (WANDB_DIR,
            sys.modules["wandb"].teardown()  # WANDB_MODE) with it: the next program reads its own
        for name in program.modules:
            sys.modules.pop(name, None)
        os.chdir(saved[0])
        sys.path[:], sys.argv[:] = saved[1], saved[2]
        for name in set(sys.modules) - saved[3]:
            module_file = getattr(sys.modules[name], "__file__", None) or ""
            if module_file.startswith((str(root), str(SEAMS))):
                del sys.modules[name]


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
