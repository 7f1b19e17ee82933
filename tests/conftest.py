"""Fixtures every docker-using test shares: the engine, the DLC stand-in and the product image,
built once per session the way a person builds it (`make build`) on the stand-in.

`make test` runs the tests in several pytest-xdist workers: an image is built by the first
worker that needs it while the others wait on a lock (build/locks), then found up to date;
the tests of one docker or delivery module stay on one worker (their module fixtures: one
cluster image, one registry); each worker's jobs keep their control folders under a TMPDIR
of their own (`container-entry stacks` lists the launches of its TMPDIR) and take their
ports from tests/ports.py.

In CI (CI set) a missing engine or tool is a failure, never a skip: .ci/run starts one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import ports

REPO = Path(__file__).resolve().parents[1]
STANDIN = os.environ.get("STANDIN", "container-entry/dlc-standin:latest")
IMAGE = "container-entry:test"
LEAN_BASE = "container-entry/lean-base:test"
LEAN_IMAGE = "container-entry:test-lean"
# seconds within which a rank that returned from its stop handler is gone, and a bootstrap
# after its last rank: about 1 s on an idle machine, up to 20 s on one whose every CPU also
# runs a busy loop beside the parallel tests; far below the grace period (100 s) that a rank
# held alive (a frozen store) waits out, which is the failure these bounds rule out
EXIT_BOUND = 25.0


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # before anything has asked tempfile for its folder in this worker
        private = Path(tempfile.gettempdir()) / f"container-entry-tests-{os.getpid()}-{worker}"
        private.mkdir(exist_ok=True)
        os.environ["TMPDIR"] = str(private)
        tempfile.tempdir = None


def shares_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a module-scoped fixture: every worker that runs one of the module's
    tests builds it again (the GPU check's self-test: 45 s, once on each of 4 workers)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.values() if info is not None else ()
    return any(d.scope == "module" for defs in definitions for d in defs)


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One worker for each module whose tests share something: docker and delivery modules (a
    cluster network, a registry, a harness) and any module with a module-scoped fixture. Then
    each module's tests spread over the run (`interleaved`)."""

    def module_of(item: pytest.Item) -> Path:
        return Path(str(item.fspath)).relative_to(REPO)

    grouped = set()
    for item in items:
        path = module_of(item)
        together = path.parts[:2] in (("tests", "docker"), ("tests", "delivery"))
        if together or shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(name=path.as_posix()))
            grouped.add(path)
    items[:] = interleaved(items, module_of, grouped)


def interleaved(
    items: list[pytest.Item], module_of: Callable[[pytest.Item], Path], grouped: set[Path]
) -> list[pytest.Item]:
    """Every module's tests spread evenly over the run; the grouped modules first, each one block.

    xdist hands the next test in this order to whichever worker is free. In file order the
    tests that mostly wait (a hang timeout, a slow preflight, a frozen host) sit in a few
    modules side by side, so for minutes all 4 workers waited and the 2 CPUs were half idle
    (run 82: 42-71 % busy for 90 s). Taken in turns (one test of each module, then the next of
    each), the short modules ran out in the first minutes and the long ones met again (run 92,
    540-610 s: three slow preflights and a 35-s checkpoint at once, 66-83 % busy). So the k-th
    of a module's n tests goes at (k + 0.5) / n of the run, beside the others' tests at that
    point. A grouped module stays one block (one worker, its module fixtures set up once),
    also when pytest runs without xdist, and starts first: a block runs for minutes on its
    worker. The order within a module is kept.
    """
    blocks: dict[Path, list[list[pytest.Item]]] = {}
    for item in items:
        module = module_of(item)
        runs = blocks.setdefault(module, [])
        if module in grouped and runs:
            runs[0].append(item)
        else:
            runs.append([item])
    placed: list[tuple[float, int, list[pytest.Item]]] = []
    for order, (module, runs) in enumerate(blocks.items()):
        for k, block in enumerate(runs):
            at = 0.0 if module in grouped else (k + 0.5) / len(runs)
            placed.append((at, order, block))
    placed.sort(key=lambda place: place[:2])
    return [item for _, _, block in placed for item in block]


@pytest.fixture(autouse=True)
def _ports_of_this_test() -> None:
    ports.new_test()


@contextlib.contextmanager
def one_builder(name: str) -> Iterator[None]:
    """One xdist worker (or one session) builds `name` at a time; the next finds it built."""
    locks = REPO / "build" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name.replace('/', '_').replace(':', '_')}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def unavailable(message: str) -> None:
    """Skip where a developer lacks a tool; fail in CI, where everything must run."""
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    if not shutil.which("docker"):
        unavailable("no docker CLI: run scripts/build/ensure-docker.sh")
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        unavailable(
            f"no docker engine ({info.stderr.strip()[-300:]}): scripts/build/ensure-docker.sh"
        )


@pytest.fixture(scope="session")
def docker_client(docker_engine):
    import docker

    return docker.from_env()


@pytest.fixture(scope="session")
def standin(docker_engine) -> str:
    with one_builder(STANDIN):
        subprocess.run([str(REPO / "scripts" / "build" / "build-standin.sh"), STANDIN], check=True)
    return STANDIN


def make_build(base: str, tag: str) -> str:
    """The product image on `base`: `make build`, as a person builds it."""
    with one_builder(tag):
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
    with one_builder(LEAN_BASE):
        subprocess.run(
            [
                *("docker", "build", "-q", "-t", LEAN_BASE),
                "-f",
                str(dockerfile),
                str(dockerfile.parent),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return LEAN_BASE


@pytest.fixture(scope="session")
def lean_image(lean_base) -> str:
    """The product image on the lean base: what the delivery tests push."""
    return make_build(lean_base, LEAN_IMAGE)
