"""gw.envs.from_verifiers with the real verifiers package, on the openai 2.x SDK it pins.

verifiers cannot join the test venv: its latest release pins openai < 3 (the venv has 3.x) and 0.3 pins
mcp < 2. So this test builds an environment of its own once (cached; overlay_env.py: verifiers and
openai 2.x over the test venv's packages, verifiers' pins winning). It runs
`verifiers_cases/cases_verifiers.py` there, in a subprocess: the point of the test is the other SDK,
which one process cannot hold beside the 3.x one. Building it costs about a minute of pip (280 MB,
mostly pyarrow for verifiers' `datasets`); set GROUPWISE_TEST_CACHE to keep it between CI runs. When PyPI
cannot be reached the test is skipped, saying so; any other failure of pip fails it.

verifiers 0.4 (its v1 stack only) gets an environment of its own the same way, with `uv` beside it: v1
runs its harness as a PEP 723 script that its subprocess runtime prepares with uv (which fetches the
script's own dependencies, openai and mcp, once into uv's cache).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from overlay_env import overlay_python

REQUIREMENTS = ["verifiers==0.3.1", "openai>=2.54,<3"]
REQUIREMENTS_V1 = ["verifiers==0.4.0", "openai>=2.54,<3", "uv"]
REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).parent / "verifiers_cases"
CASES_V1 = Path(__file__).parent / "verifiers_v1_cases"
PROBE = ("import openai, verifiers as vf; assert openai.__version__.startswith('2.'); "
         "vf.SingleTurnEnv, vf.ToolEnv, vf.JudgeRubric, vf.OpenAIChatCompletionsClient")
PROBE_V1 = ("import openai, verifiers.v1 as vf; assert openai.__version__.startswith('2.'); "
            "vf.Taskset, vf.SingleAgentEnv, vf.Toolset")


def _verifiers_python(requirements: list[str] = REQUIREMENTS, probe_code: str = PROBE) -> Path:
    return overlay_python(requirements, probe_code, "verifiers")


def test_verifiers_environments_train_under_gw_fit_on_the_openai_2_sdk(tmp_path, tiny_model_env):
    python = _verifiers_python()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           **tiny_model_env}
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-o", "python_files=cases_*.py",
                           "--basetemp", str(tmp_path / "cases"), str(CASES)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    assert re.search(r"\b7 passed\b", done.stdout) and "skipped" not in done.stdout, tail


def test_verifiers_v1_tasksets_train_under_gw_fit_on_the_openai_2_sdk(tmp_path, tiny_model_env):
    python = _verifiers_python(REQUIREMENTS_V1, PROBE_V1)
    # the env's bin holds uv (v1's runtime looks for it on the PATH); the cases folder is on PYTHONPATH because
    # v1 imports a taskset by module name, in this process and in the tool servers it launches
    env = {**os.environ, "PATH": os.pathsep.join([str(python.parent), os.environ.get("PATH", "")]),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(CASES_V1), os.environ.get("PYTHONPATH", "")]),
           **tiny_model_env}
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", "-o",
                           "python_files=cases_*.py", "--basetemp", str(tmp_path / "cases"), str(CASES_V1)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail
    assert re.search(r"\b6 passed\b", done.stdout) and "skipped" not in done.stdout, tail
