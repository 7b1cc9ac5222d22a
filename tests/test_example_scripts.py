"""The scripts in examples/ (how a user writes a model) run and verify against CVXPY."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).parent.parent / "examples").glob("*.py"))


def test_there_are_example_scripts():
    assert len(SCRIPTS) >= 3


@pytest.mark.integration     # each script in a subprocess, end to end: CI runs it after the fast suite
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_example_script_runs_and_verifies(script):
    completed = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                               timeout=300)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "verdict (rtol 0.001): OK" in completed.stdout or "verified: True" in completed.stdout
