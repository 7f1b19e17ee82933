"""The scripts' command lines start: every `python -m scripts.NAME` the Makefile runs, and the
scripts that also run by path (build/push.py from the buildspec, gpu/benchmark.py on a GPU
host)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

MAKEFILE_MODULES = sorted(set(re.findall(r"-m scripts\.([\w.]+)", (REPO / "Makefile").read_text())))
# and gpu.benchmark, which the docs run by path (tests/unit/test_gpu_benchmark.py)
ARGPARSE_MODULES = [
    *(m for m in MAKEFILE_MODULES if m not in ("local.run", "local.cluster")),
    "gpu.benchmark",
]


def test_the_makefile_runs_the_benchmarks_and_push():
    for name in ("bench.relay", "bench", "bench.threads", "simulate.hosts", "build.push"):
        assert name in MAKEFILE_MODULES


@pytest.mark.parametrize("name", ARGPARSE_MODULES)
def test_python_m_runs_the_command_line(name: str) -> None:
    """`--help` reaches argparse only when the module calls its main() (simulate_hosts once
    did not: `make bench-liveness` did nothing)."""
    done = subprocess.run(
        [sys.executable, "-m", f"scripts.{name}", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: "), done.stdout


@pytest.mark.parametrize("how", ["path", "module"])
def test_push_runs_by_path_as_the_buildspec_runs_it_and_as_a_module(how: str) -> None:
    """`python scripts/build/push.py should-push` (its sibling push_policy.py found by path) and
    `python -m scripts.build.push should-push` (make): no ref, so not pushed (exit 1)."""
    start = (
        [str(REPO / "scripts" / "build" / "push.py")]
        if how == "path"
        else ["-m", "scripts.build.push"]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEBUILD_", "RELEASE_"))}
    if how == "path":
        env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, *start, "should-push"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr == "push: ref '(none)' is neither branch main nor a tag: not pushed\n"
