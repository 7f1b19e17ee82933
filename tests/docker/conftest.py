"""Docker fixtures: a real engine, the real Dockerfile built on the offline DLC stand-in.

In CI (CI=true) a missing engine is a failure, never a skip: .ci/run starts one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = os.environ.get("STANDIN", "container-entry/dlc-standin:latest")
IMAGE = "container-entry:test"
sys.path.insert(0, str(REPO / "scripts"))


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/docker/" in str(item.fspath):
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def docker_client():
    import docker

    try:
        client = docker.from_env()
        client.ping()
    except Exception as error:  # no engine
        message = f"no docker engine ({error}); run scripts/ensure-docker.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return client


@pytest.fixture(scope="session")
def standin(docker_client) -> str:
    subprocess.run([str(REPO / "scripts" / "build-standin.sh"), STANDIN], check=True)
    return STANDIN


@pytest.fixture(scope="session")
def image(standin) -> str:
    subprocess.run(
        [
            "docker",
            "build",
            "-q",
            "-f",
            "docker/Dockerfile",
            "--build-arg",
            f"BASE_IMAGE={standin}",
            "--build-arg",
            "REVISION=test",
            "-t",
            IMAGE,
            ".",
        ],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return IMAGE


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
