"""Docker fixtures beyond the shared ones in tests/conftest.py (engine, stand-in, image)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import IMAGE, REPO, STANDIN, one_builder

__all__ = ["IMAGE", "STANDIN"]


def until(predicate, timeout: float) -> bool:
    """Whether `predicate` came true within `timeout` seconds (polled every 0.5 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.5)
    return False


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/docker/" in str(item.fspath):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def train_data() -> bytes:
    """The example's training rows, written by the example itself (`--write-data`) once per
    checkout and version of the script: it imports torch and transformers to do it (5 s of
    CPU), and every worker that runs a docker module needs the same bytes."""
    script = REPO / "examples" / "hf_trainer_tiny.py"
    digest = hashlib.sha256(script.read_bytes()).hexdigest()[:16]
    directory = REPO / "build" / f"train-data-{digest}"
    with one_builder(directory.name):
        if not (directory / "data.jsonl").exists():
            partial = Path(tempfile.mkdtemp(dir=directory.parent, prefix=f"{directory.name}."))
            subprocess.run([sys.executable, str(script), "--write-data", str(partial)], check=True)
            partial.rename(directory)
    return (directory / "data.jsonl").read_bytes()
