"""Run one of scripts/ as make and scripts/build/build-standin.sh do: `python -m scripts.<name>`
from the repository root, output captured, the exit status left to the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_script_module(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", f"scripts.{name}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
