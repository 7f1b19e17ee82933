"""Real /opt/ml trees in temp dirs and real bootstrap processes (no mocks)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.ports import this_test_port

REPO = Path(__file__).resolve().parents[2]
# the newest torch's venv (`make newest-torch`, requirements/torch-newest.txt): the tests that
# hold the stop, exit and teardown guarantees on the newest launcher run their bootstrap,
# torchrun and ranks with its Python; the rest run the .venv's torch (requirements/dev.txt)
NEWEST_PYTHON = REPO / ".venv-torch-newest" / "bin" / "python"
TRAINER = REPO / "examples" / "hf_trainer_tiny.py"
PROBE = REPO / "tests" / "scripts" / "ddp_probe.py"


@dataclass
class MlTree:
    base: Path
    extra_env: dict[str, str] = field(default_factory=dict)  # set by a test's setup step

    @property
    def output(self) -> Path:
        return self.base / "output"

    def summaries(self, pattern: str) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted((self.output / "data").glob(pattern))]


def make_tree(
    root: Path,
    *,
    current_host: str = "algo-1",
    hosts: tuple[str, ...] = ("algo-1",),
    hyperparameters: dict[str, str] | None = None,
    script: Path | None = PROBE,
    interface: str = "lo",
) -> MlTree:
    """A SageMaker-shaped tree: config files, a train channel, code in /opt/ml/code."""
    base = root / current_host / "ml"
    config = base / "input" / "config"
    config.mkdir(parents=True)
    (config / "resourceconfig.json").write_text(
        json.dumps(
            {
                "current_host": current_host,
                "hosts": list(hosts),
                "network_interface_name": interface,
            }
        )
    )
    (config / "hyperparameters.json").write_text(json.dumps(hyperparameters or {}))
    (config / "inputdataconfig.json").write_text(
        json.dumps(
            {"train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}}
        )
    )
    (base / "input" / "data" / "train").mkdir(parents=True)
    (base / "code").mkdir()
    if script is not None:
        shutil.copy(script, base / "code" / script.name)
    return MlTree(base)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def bootstrap_env(tree: MlTree, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SM_", "PET_", "SAGEMAKER_", "CONTAINER_ENTRY_"))
    }
    env.update({"SAGEMAKER_BASE_DIR": str(tree.base), "CONTAINER_ENTRY_HOST_WAIT_TIMEOUT": "20"})
    hyperparameters = tree.base / "input" / "config" / "hyperparameters.json"
    if b"container_entry_master_port" not in _read(hyperparameters):  # the job's own choice
        # not 29500: tests run concurrently (tests/ports.py)
        env["CONTAINER_ENTRY_MASTER_PORT"] = str(this_test_port())
    env.update(tree.extra_env)
    env.update(extra)
    return env


def control_dir(bootstrap_pid: int, name: str = "job") -> Path:
    """Where a running bootstrap keeps its workers' pid files (container_entry.common.layout)."""
    from container_entry.common.layout import CONTROL_ROOT

    return CONTROL_ROOT / f"{bootstrap_pid}-{name}"


def bootstrap_argv(*args: str, python: str = sys.executable) -> list[str]:
    return [python, "-m", "container_entry", "train", *args]


def launcher_of(request: pytest.FixtureRequest, release: str, folder: Path) -> tuple[str, dict]:
    """The Python a job of `release` runs with, and what its environment adds: "newest", the
    newest torch's venv; a version, the .venv's launcher planned as that release
    (`torch_metadata` in front of it on PYTHONPATH)."""
    if release == "newest":
        return request.getfixturevalue("newest_python"), {}
    return sys.executable, {"PYTHONPATH": str(torch_metadata(folder, release))}


@pytest.fixture(scope="session")
def newest_python() -> str:
    """The newest torch's Python, with this checkout installed (`make newest-torch`)."""
    if not NEWEST_PYTHON.exists():
        unavailable(f"no {NEWEST_PYTHON.parent.parent.name}: run `make newest-torch`")
    return str(NEWEST_PYTHON)


def with_hosts_file(argv: list[str], hosts_file: Path) -> list[str]:
    """Run argv in a private mount namespace whose /etc/hosts is `hosts_file` (needs root):
    each bootstrap resolves algo-N like a SageMaker container, the machine's file is untouched.
    """
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--", "sh", "-c", script, str(hosts_file), *argv]


@pytest.fixture
def hosts_file(tmp_path: Path) -> Path:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("two-host tests need root and unshare (CI runs as root)")
    path = tmp_path / "hosts"
    path.write_text("127.0.0.1 localhost\n127.0.0.1 algo-1\n127.0.0.1 algo-2\n")
    return path


def run(argv: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, cwd="/", check=False
    )


def torch_metadata(folder: Path, version: str) -> Path:
    """A torch-<version>.dist-info on PYTHONPATH in front of the real torch: the bootstrap then
    plans for that release while the installed launcher runs. "2.9.0" stands in for the
    default base's torchrun, which has no --shutdown-timeout (the bootstrap delivers a stop)."""
    from importlib.metadata import distribution

    info = folder / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    # the first torch on the path is the one whose entry points count: torch >= 2.12 finds its
    # own gloo backend through them
    entry_points = distribution("torch").read_text("entry_points.txt")
    if entry_points:
        (info / "entry_points.txt").write_text(entry_points)
    return folder


def ranks_started(tree: MlTree, count: int = 2) -> bool:
    """True once `count` ranks printed their first line (fault_probe.py: its SIGTERM handler is
    installed)."""
    logs = (tree.output / "data/container-entry/logs").glob("rank-*.log")
    return sum("started rank" in path.read_text() for path in logs) == count


def wait_for(predicate: Callable[[], object], timeout: float = 60.0) -> bool:
    """Whether `predicate` came true within `timeout` s (looked at every 0.05 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


class Drained:
    """A process's stderr read as it comes, each line with the moment it was read (its stdout
    read and dropped): a test waits for a line while the process runs, or times it."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[tuple[float, str]] = []
        self.readers = [
            threading.Thread(target=self._read, args=(process.stdout, None), daemon=True),
            threading.Thread(target=self._read, args=(process.stderr, self.lines), daemon=True),
        ]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, keep: list[tuple[float, str]] | None) -> None:
        for line in stream:
            if keep is not None:
                keep.append((time.time(), line.rstrip("\n")))

    def when(self, text: str) -> float | None:
        """When the first line with `text` was read; None before it."""
        return next((t for t, line in list(self.lines) if text in line), None)

    def said(self, text: str) -> bool:
        return self.when(text) is not None

    def text(self) -> str:
        return "\n".join(line for _, line in list(self.lines))

    def finish(self, timeout: float) -> tuple[int, str]:
        """(exit status, stderr) once the process ended and its streams are read."""
        self.process.wait(timeout=timeout)
        for reader in self.readers:
            reader.join(timeout=10)
        return self.process.returncode, self.text()
