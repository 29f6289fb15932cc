"""gw.envs.from_openenv on `openenv-core` 0.3, the distribution that `openenv` 0.10 succeeds.

Both install the module `openenv`, so one venv holds one of them: the test venv has openenv 0.10 (the
`openenv` extra's pin), and this test runs the same OpenEnv tests (test_openenv_hub.py: the real server
under uvicorn, its typed client, training steps) in a cached environment where openenv-core 0.3 wins
(overlay_env.py). In 0.3 the client's `reset`/`step` are coroutine functions; in 0.10 they return an
awaitable on a running event loop and a result elsewhere.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from overlay_env import overlay_python

REQUIREMENTS = ["openenv-core==0.3.0"]
PROBE = ("import importlib.metadata as m, openenv.core; assert m.version('openenv-core') == '0.3.0'; "
         "openenv.core.EnvClient, openenv.core.env_server.create_app")
REPO = Path(__file__).resolve().parents[2]


def test_openenv_environments_train_on_openenv_core_0_3(tmp_path, tiny_model_env):
    python = overlay_python(REQUIREMENTS, PROBE, "openenv")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           **tiny_model_env}
    probe = subprocess.run([str(python), "-c", "import openenv, importlib.metadata as m; "
                            "print(m.version('openenv-core'), openenv.__file__)"], env=env, capture_output=True, text=True)
    assert probe.stdout.startswith("0.3.0 ") and str(python.parents[1]) in probe.stdout, probe.stdout + probe.stderr
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "--basetemp", str(tmp_path / "cases"), str(Path(__file__).parent / "test_openenv_hub.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    assert re.search(r"\b3 passed\b", done.stdout) and "skipped" not in done.stdout, tail
