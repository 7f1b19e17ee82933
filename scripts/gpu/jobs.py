"""What the GPU checks (scripts/gpu/check.py) run on: SageMaker-shaped trees, bootstrap processes
watched line by line, and the processes a job leaves behind. Stdlib only: a bare GPU host has
the checkout and its Python, nothing more."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = REPO / "scripts" / "gpu" / "probe.py"
HF_EXAMPLE = REPO / "examples" / "hf_trainer_tiny.py"
INHERITED_OFF = ("SM_", "PET_", "SAGEMAKER_", "CONTAINER_ENTRY_", "TORCHELASTIC_")
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MARKER = "GPU_CHECK_JOB"  # in every job's environment: its tree, inherited by each descendant


@dataclass(frozen=True)
class Context:
    """Everything a scenario needs to know about this host and this run of the check."""

    device: str  # "cuda" or "cpu"
    gpus: int  # nvidia-smi -L lines (0 on cpu)
    work: Path
    python: str
    checkpoint_seconds: float
    interface: str
    env: Mapping[str, str]  # the bootstrap's environment before a scenario's own variables

    @property
    def world(self) -> int:
        return self.gpus if self.device == "cuda" else 1

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"


class Failed(Exception):
    """An expectation that did not hold: the scenario's FAIL reason."""


class Skipped(Exception):
    """The scenario cannot run on this host: its reason."""


def expect(condition: object, reason: str) -> None:
    if not condition:
        raise Failed(reason)


@dataclass
class Result:
    name: str
    verdict: str  # "ok", "FAIL" or "skipped"
    detail: str
    seconds: float = 0.0


def first_interface(sys_net: Path = Path("/sys/class/net")) -> str:
    """An interface that exists (resourceconfig.json must name one): the first that is not lo."""
    names = sorted(p.name for p in sys_net.iterdir()) if sys_net.is_dir() else []
    return next((n for n in names if n != "lo"), "lo")


def free_port_pair() -> int:
    """A port whose successor is free too: the master port and the bootstraps' side channel.
    Each scenario gets its own, so a scenario's leftovers or a parallel test never collide."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise RuntimeError("no two consecutive free ports found on 127.0.0.1")


def base_env(device: str, pythonpath: str | None) -> dict[str, str]:
    """This environment without anything a SageMaker container would not have (a stray
    CONTAINER_ENTRY_* is an error to the bootstrap; a stray RANK confuses torchrun)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(INHERITED_OFF) and k not in RANK_VARIABLES
    }
    env["PYTHONUNBUFFERED"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # a CPU job even on a GPU host: "no GPU" on purpose
    return env


def make_tree(ctx: Context, name: str, script: Path, hps: Mapping[str, str]) -> Path:
    """`<work>/<name>/ml`, laid out as SageMaker lays /opt/ml for a one-host job."""
    folder = ctx.work / name
    if folder.exists():
        shutil.rmtree(folder)
    base = folder / "ml"
    config = base / "input" / "config"
    config.mkdir(parents=True)
    resource = {
        "current_host": "algo-1",
        "hosts": ["algo-1"],
        "network_interface_name": ctx.interface,
    }
    (config / "resourceconfig.json").write_text(json.dumps(resource))
    encoded = {k: json.dumps(v) for k, v in hps.items()}  # SDK v2 JSON-encodes every value
    (config / "hyperparameters.json").write_text(json.dumps(encoded))
    channel = {"train": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated"}}
    (config / "inputdataconfig.json").write_text(json.dumps(channel))
    (base / "input" / "data" / "train").mkdir(parents=True)
    (base / "code").mkdir()
    (base / "checkpoints").mkdir()
    shutil.copy(script, base / "code" / script.name)
    return base


def job_env(ctx: Context, base: Path, program: str, **extra: str) -> dict[str, str]:
    env = dict(ctx.env)
    env.update(SAGEMAKER_BASE_DIR=str(base), SAGEMAKER_PROGRAM=program)
    env["CONTAINER_ENTRY_MASTER_PORT"] = str(free_port_pair())
    env[MARKER] = str(base)
    env.update(extra)
    return env


def session_members(session: int, proc: Path = Path("/proc")) -> list[int]:
    """Live (not zombie) processes of a session: torchrun makes its own process group, so a
    process group kill misses it, but it and its ranks stay in the bootstrap's session."""
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[3]) == session:
            members.append(int(entry.name))
    return members


def _state(entry: Path) -> str:
    return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]


def job_processes(base: str, proc: Path = Path("/proc")) -> list[int]:
    """Live processes (other than this one) of the job on tree `base`: its path in their
    command line (the ranks' scripts) or its marker in their environment (torchrun starts each
    worker in a session of its own, so the bootstrap's session does not hold them)."""
    marker = f"{MARKER}={base}".encode() + b"\0"
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            ours = base.encode() in cmdline or marker in (entry / "environ").read_bytes() + b"\0"
            if ours and _state(entry) != "Z":
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def alive(pid: int) -> bool:
    try:
        return _state(Path(f"/proc/{pid}")) != "Z"
    except (OSError, IndexError):
        return False


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Job:
    """A bootstrap process in a session of its own; every line it prints is kept and logged."""

    process: subprocess.Popen
    log: Path
    lines: list[str] = field(default_factory=list)
    marker: str | None = None  # MARKER's value in its environment
    exited_at: float | None = None  # time.time() when wait() saw it gone
    _changed: threading.Condition = field(default_factory=threading.Condition)

    @classmethod
    def start(cls, argv: list[str], env: Mapping[str, str], log: Path, cwd: Path) -> Job:
        process = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        job = cls(process, log, marker=env.get(MARKER))
        threading.Thread(target=job._read, daemon=True).start()
        return job

    def _read(self) -> None:
        with self.log.open("w") as log:
            for line in self.process.stdout:  # type: ignore[union-attr]
                log.write(line)
                log.flush()
                with self._changed:
                    self.lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, condition: Callable[[list[str]], bool], timeout: float) -> bool:
        """Until `condition(lines)` holds (True), the job ends or the timeout passes (False)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not condition(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    return condition(self.lines)
                self._changed.wait(min(left, 0.5))
        return True

    def wait(self, timeout: float) -> int | None:
        """The exit code, noting when the process was seen gone; None after the timeout."""
        deadline = time.monotonic() + timeout
        while (code := self.process.poll()) is None:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)
        self.exited_at = self.exited_at or time.time()
        return code

    def leftovers(self) -> list[int]:
        """Live processes of this job: its session (the bootstrap, torchrun) and every process
        that carries its marker (the workers, in sessions of their own)."""
        found = set(session_members(self.process.pid))
        if self.marker:
            found |= set(job_processes(self.marker))
        return sorted(found)

    def kill(self) -> None:
        """The bootstrap's process group, then whatever is left of the job."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        for _ in range(3):
            kill_all(self.leftovers())
            time.sleep(0.2)

    def run(self, timeout: float) -> int | None:
        """Wait for the end; a job still running after `timeout` is killed (None)."""
        code = self.wait(timeout)
        if code is None:
            self.kill()
        return code


def start_job(ctx: Context, base: Path, program: str, **extra: str) -> Job:
    argv = [ctx.python, "-m", "container_entry", "train"]
    env = job_env(ctx, base, program, **extra)
    return Job.start(argv, env, base.parent / "out.txt", base.parent)


def probe_facts(lines: list[str]) -> dict[int, dict]:
    """{rank: its PROBE json} from the console lines (`[algo-1 rank 0] PROBE {...}`)."""
    found: dict[int, dict] = {}
    for line in lines:
        at = line.find("PROBE {")
        if at < 0:
            continue
        with contextlib.suppress(ValueError):
            data = json.loads(line[at + len("PROBE ") :])
            if isinstance(data, dict) and isinstance(data.get("rank"), int):
                found.setdefault(data["rank"], data)
    return found


def failure_line(base: Path) -> str:
    """The failure file's first line ("" when there is none)."""
    try:
        return (base / "output" / "failure").read_text(errors="replace").splitlines()[0]
    except (OSError, IndexError):
        return ""


def run_dir(base: Path) -> Path:
    return base / "output" / "data" / "container-entry"


def short(text: str, limit: int = 110) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
