"""Docker fixtures beyond the shared ones in tests/conftest.py (engine, stand-in, image)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import IMAGE, REPO, STANDIN

__all__ = ["IMAGE", "STANDIN"]


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/docker/" in str(item.fspath):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def train_data(tmp_path_factory) -> bytes:
    directory = tmp_path_factory.mktemp("data")
    subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "hf_trainer_tiny.py"),
            "--write-data",
            str(directory),
        ],
        check=True,
    )
    return (directory / "data.jsonl").read_bytes()
