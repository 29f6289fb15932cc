"""A cached Python environment over the test venv, for a package whose pins the venv cannot hold.

A venv without pip whose own site-packages holds `requirements` and which then reads the test venv's
site-packages (a .pth appends them, so torch, transformers and groupwise itself come from there, while the
requirements' own versions win). Built once and cached under $GROUPWISE_TEST_CACHE (default
~/.cache/groupwise-tests). When PyPI cannot be reached the calling test is skipped, saying so; any other
failure of pip fails it.
"""

from __future__ import annotations

import hashlib
import os
import re
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

UNREACHABLE = re.compile(r"Failed to establish a new connection|Temporary failure in name resolution|"
                         r"Network is unreachable|Connection refused|ConnectTimeoutError|ReadTimeoutError|"
                         r"No matching distribution found")


def env_dir(requirements: list[str], name: str) -> Path:
    root = Path(os.environ.get("GROUPWISE_TEST_CACHE") or Path.home() / ".cache" / "groupwise-tests")
    tag = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    return root / f"{name}-env-py{sys.version_info.major}{sys.version_info.minor}-{tag}"


def overlay_python(requirements: list[str], probe_code: str, name: str) -> Path:
    """The cached environment's python, built when missing (module doc); skips when PyPI is unreachable."""
    env = env_dir(requirements, name)
    python = env / "bin" / "python"
    if not python.exists():
        venv.EnvBuilder(with_pip=False, clear=True).create(env)
    own = Path(subprocess.check_output([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                                       text=True).strip())
    # addsitedir, not a bare path: the test venv's own .pth files (an editable install) are read too
    lines = "".join(f"import site; site.addsitedir({p!r})\n" for p in site.getsitepackages())
    (own / "zz_groupwise_test_venv.pth").write_text(lines)
    marker = own / "groupwise-test-requirements.txt"
    # the cached install was resolved against the test venv of its day: a probe that fails (a package the
    # venv had then and lacks now) installs again, which pip fills in from what is missing
    probe = subprocess.run([str(python), "-c", probe_code], capture_output=True, text=True)
    if probe.returncode != 0 or not marker.exists() or marker.read_text() != "\n".join(requirements):
        done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                               "--disable-pip-version-check", *requirements], capture_output=True, text=True)
        if done.returncode != 0:
            if UNREACHABLE.search(done.stdout + done.stderr):
                pytest.skip(f"PyPI unreachable, {requirements} not installed: {(done.stderr or done.stdout)[-300:]}")
            raise AssertionError(f"pip could not install {requirements}:\n{done.stdout}\n{done.stderr}")
        marker.write_text("\n".join(requirements))
    return python
