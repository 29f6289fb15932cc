"""`groupwise audit <env>` end to end: the command line, the env's real rollout, the table and the exit code."""

from __future__ import annotations

import json
import subprocess
import sys

from groupwise.cli import main
from groupwise.loop.audit import PROBES


def test_audit_of_an_honest_env_with_its_demonstrator_exits_0(tmp_path):
    out = tmp_path / "audit.json"
    proc = subprocess.run([sys.executable, "-m", "groupwise", "audit", "tictactoe", "--scenarios", "8", "--json",
                           str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "env=tictactoe" in proc.stdout and "no probe scored at or above the honest answers" in proc.stdout
    report = json.loads(out.read_text())
    assert report["flagged"] == [] and report["scenarios"] == 8
    assert [p["name"] for p in report["probes"]] == list(PROBES)
    assert report["honest"]["reward"]["mean"] > max(p["reward"]["mean"] for p in report["probes"])


def test_audit_with_the_base_model_samples(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "audit.json"
    code = main(["audit", "2048", "--honest", "model", "--model", tiny_model_dir, "--scenarios", "3", "--samples", "1",
                 "--probe", "empty,fixed", "--device", "cpu", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == (1 if report["flagged"] else 0)
    assert report["honest_source"].startswith("model ") and report["honest"]["reward"]["n"] == 3
    assert [p["name"] for p in report["probes"]] == ["empty", "fixed"]
    assert "reward audit:" in capsys.readouterr().out


def test_audit_refuses_what_it_cannot_run(capsys):
    assert main(["audit", "math", "--honest", "reference"]) == 2
    assert "no scripted demonstrator" in capsys.readouterr().err
