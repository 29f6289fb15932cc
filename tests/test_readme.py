"""The README's Python example runs as written (on a tiny random model instead of SmolLM2, two steps instead
of twenty), and so do the `groupwise` commands after it, on the run it made."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def example() -> str:
    found = [b for b in blocks("python") if "gw.fit(" in b]
    assert len(found) == 1, "the README should hold exactly one complete gw.fit example"
    return found[0]


def replace_once(code: str, old: str, new: str) -> str:
    assert code.count(old) == 1, f"the README example no longer contains {old!r}: update this test"
    return code.replace(old, new)


@pytest.mark.slow
def test_the_readme_example_trains_and_the_commands_after_it_read_the_run(tiny_model_dir, tmp_path):
    code = replace_once(example(), 'base_model="smollm2-135m"', f"base_model={tiny_model_dir!r}")
    code = replace_once(code, "max_steps=20", "max_steps=2")
    code = replace_once(code, "eval_every=5", "eval_every=1")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "best val/accuracy" in done.stdout and "test (best checkpoint)" in done.stdout

    import groupwise as gw

    history = gw.load_history(tmp_path / ".groupwise/sentiment/models/critic")
    assert {r["step"] for r in history if r.get("split") == "val"} == {0, 1, 2}
    assert any(r.get("split") == "test" for r in history)
    assert any(r.get("split") == "stop" for r in history)

    commands = [line for b in blocks("bash") for line in b.splitlines() if line.startswith("groupwise ")]
    assert [c.split()[1] for c in commands] == ["inspect", "report", "dashboard"]
    for command in commands:
        argv = command.split("#")[0].split()
        if argv[1] == "dashboard":  # a server: it lists the run the example trained, then is stopped
            assert_dashboard_lists(argv, tmp_path, "sentiment/models/critic")
            continue
        ran = subprocess.run([sys.executable, "-m", "groupwise.cli", *argv[1:]], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert ran.returncode == 0, f"{command}: {ran.stderr[-2000:]}"
        assert ran.stdout.strip()


def assert_dashboard_lists(argv: list[str], cwd: Path, run: str) -> None:
    import json
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "groupwise.cli", *argv[1:], "--port", str(port)], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=5) as r:
                    runs = json.load(r)["runs"]
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() is not None else "timeout"
                time.sleep(0.2)
        assert [(x["id"], x["state"]) for x in runs] == [(run, "stopped")]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
