"""Virtual environments holding one SageMaker Python SDK each, their clients, and the cleanup
of their local mode.

SDK v2 and v3 cannot share a venv, and neither belongs in the dev venv: each gets
venv-<name>-<hash> in the machine's cache (~/.cache/container-entry, XDG_CACHE_HOME), created
from its requirements lock on first use and reused by every checkout while the lock and the
interpreter are those of its hash (a stamp file says it was built whole). A fresh clone then
builds nothing (the two took 48 s of CPU on each fresh clone's `make test`, issue 35).

Both SDKs' local modes put their containers on one network named `sagemaker-local`, which compose
creates when it is missing and the cleanup removes when it is empty: two jobs at once create two
networks of that name (then `network sagemaker-local is ambiguous`, run 51 in docs/test-speed.md)
or remove the other's. SDK v3's also names its containers `algo-1`, `algo-2`, which two jobs
would answer for each other. So every local-mode job takes its turn (`sdk_local_mode`), whichever
xdist worker runs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from scripts.build.dev_venv import cache_dir

REPO = Path(__file__).resolve().parents[2]
STAMP = ".requirements.sha256"
FORBIDDEN = ("torch", "nvidia-", "triton")  # the SDK clients must never pull these
CLIENT_TIMEOUT = 420


def _digest(requirements: Path) -> str:
    content = requirements.read_bytes() + sys.version.encode()
    return hashlib.sha256(content).hexdigest()


def ensure_venv(name: str, requirements: Path) -> Path:
    """The python of the cached venv-<name>-<hash>, built from `requirements` unless a checkout
    built it before."""
    digest = _digest(requirements)
    venv = cache_dir() / f"venv-{name}-{digest[:16]}"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be building the same venv
        stamp = venv / STAMP
        if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
            return python
        shutil.rmtree(venv, ignore_errors=True)
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "--disable-pip-version-check", "--no-input"]
        install = subprocess.run(
            [*pip, "install", "-q", "--no-deps", "--no-compile", "-r", str(requirements)],
            capture_output=True,
            text=True,
            check=False,
        )
        if install.returncode:  # pip's stderr is noisy here (missing local index dirs)
            raise RuntimeError(f"pip install -r {requirements.name} failed:\n{install.stderr}")
        subprocess.run([*pip, "check"], check=True, stdout=subprocess.DEVNULL)
        frozen = subprocess.run(
            [*pip, "freeze"], check=True, capture_output=True, text=True
        ).stdout.lower()
        pulled = [line for line in frozen.splitlines() if line.startswith(FORBIDDEN)]
        if pulled:
            raise RuntimeError(f"{requirements.name} pulled {pulled}")
        stamp.write_text(digest + "\n")
        print(f"built {venv} in {time.monotonic() - started:.0f} s", file=sys.stderr)
        return python


@dataclass
class LocalModeContainers:
    """What the SDK's docker compose left behind: exit code and log tail per service."""

    exit_codes: dict[str, int] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def local_mode_cleanup(docker_client, root: Path) -> Iterator[LocalModeContainers]:
    """Remove the containers of every compose project under `root` and the SDK's network.

    The SDKs run `docker compose up --abort-on-container-exit` and never `down`: the stopped
    containers and the `sagemaker-local` network stay. Their exit codes and logs are recorded
    before removal (compose's own exit status is that of the first container to exit only).
    """
    found = LocalModeContainers()
    try:
        yield found
    finally:
        label = "com.docker.compose.project.working_dir"
        for container in docker_client.containers.list(all=True, filters={"label": label}):
            if not container.labels.get(label, "").startswith(str(root)):
                continue
            service = container.labels.get("com.docker.compose.service", container.name)
            found.exit_codes[service] = container.attrs["State"]["ExitCode"]
            found.logs[service] = container.logs().decode(errors="replace")
            container.remove(force=True)
        for network in docker_client.networks.list(names=["sagemaker-local"]):
            network.reload()
            if not network.attrs.get("Containers"):
                with contextlib.suppress(Exception):  # another job may have just joined it
                    network.remove()


@contextlib.contextmanager
def sdk_local_mode() -> Iterator[None]:
    """One SDK local-mode job (v2 or v3) at a time on this machine: their one network name,
    v3's fixed `algo-N` names."""
    locks = REPO / "build" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / "sdk-local-mode.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def client_env(tmp_path: Path) -> dict[str, str]:
    """An SDK client's environment: fake AWS credentials (AWS itself cannot exist here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PYTHON", "VIRTUAL"))}
    env.update(
        AWS_ACCESS_KEY_ID="AKIAFAKEFAKEFAKEFAKE",
        AWS_SECRET_ACCESS_KEY="fake-secret-key",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_CONFIG_FILE=str(tmp_path / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        SAGEMAKER_SUPPRESS_V2_WARNING="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def run_client(
    python: Path, source: str, tmp_path: Path, *args: str, check: bool = True
) -> tuple[dict, str]:
    """Run an SDK client script; its result line (`check`: required) and its output."""
    script = tmp_path / "client.py"
    script.write_text(source)
    result = subprocess.run(
        [str(python), str(script), *args],
        cwd=tmp_path,
        env=client_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT,
        check=False,
    )
    output = result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("CLIENT-RESULT ")]
    if not check:
        return {}, output
    assert result.returncode == 0, output[-6000:]
    assert lines, output[-6000:]
    return json.loads(lines[-1].removeprefix("CLIENT-RESULT ")), output


def members(archive: Path) -> dict[str, bytes]:
    """The files of a tar.gz the SDK wrote (model.tar.gz, output.tar.gz), by name."""
    with tarfile.open(archive) as tar:
        found = {}
        for member in tar:
            data = tar.extractfile(member) if member.isfile() else None
            if data is not None:
                found[member.name.removeprefix("./")] = data.read()
        return found
