"""Fixtures every docker-using test shares: the engine, the DLC stand-in and the product image,
built once per session the way a person builds it (`make build`) on the stand-in.

In CI (CI set) a missing engine or tool is a failure, never a skip: .ci/run starts one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STANDIN = os.environ.get("STANDIN", "container-entry/dlc-standin:latest")
IMAGE = "container-entry:test"
LEAN_BASE = "container-entry/lean-base:test"
LEAN_IMAGE = "container-entry:test-lean"


def unavailable(message: str) -> None:
    """Skip where a developer lacks a tool; fail in CI, where everything must run."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    if not shutil.which("docker"):
        unavailable("no docker CLI: run scripts/ensure-docker.sh")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        unavailable(f"no docker engine ({info.stderr.strip()[-300:]}): scripts/ensure-docker.sh")


@pytest.fixture(scope="session")
def docker_client(docker_engine):
    import docker

    return docker.from_env()


@pytest.fixture(scope="session")
def standin(docker_engine) -> str:
    subprocess.run([str(REPO / "scripts" / "build-standin.sh"), STANDIN], check=True)
    return STANDIN


def make_build(base: str, tag: str) -> str:
    """The product image on `base`: `make build`, as a person builds it."""
    result = subprocess.run(
        ["make", "--no-print-directory", "build", f"BASE_IMAGE={base}", f"IMAGE={tag}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"make build failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return tag


@pytest.fixture(scope="session")
def image(standin) -> str:
    """The product image on the DLC stand-in (the default base's versions)."""
    return make_build(standin, IMAGE)


@pytest.fixture(scope="session")
def lean_base(standin) -> str:
    """Debian's python3 venv and nothing else (the stand-in build made its Debian base)."""
    dockerfile = REPO / "tests" / "delivery" / "lean-base.Dockerfile"
    subprocess.run(
        ["docker", "build", "-q", "-t", LEAN_BASE, "-f", str(dockerfile), str(dockerfile.parent)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return LEAN_BASE


@pytest.fixture(scope="session")
def lean_image(lean_base) -> str:
    """The product image on the lean base: what the delivery tests push."""
    return make_build(lean_base, LEAN_IMAGE)
