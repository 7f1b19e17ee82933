"""Where a launch keeps its files: the one home of every name in its two folders. Stdlib only
(the worker wrapper uses it).

- The run folder, `<base>/output/data/container-entry/`, is uploaded with the job's output: what
  a user reads after the job (rank logs, records, stacks, flight-recorder dumps, failure.json).
- The control folder, `<tmp>/container-entry/<bootstrap pid>-<name>/`, is private to the
  container and removed when the launch ends: what must not be uploaded (the script's command
  line holds the hyperparameters, secrets included) and what only the running launch needs
  (workers' pids, the stop file, the preflight markers, the dump requests' FIFOs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

RUN_PARTS = ("output", "data", "container-entry")  # under the base dir


@dataclass(frozen=True)
class RunDir:
    """The run folder of one host's job."""

    path: Path

    @classmethod
    def of(cls, base_dir: Path | str) -> RunDir:
        return cls(Path(base_dir, *RUN_PARTS))

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def stacks(self) -> Path:
        return self.path / "stacks"

    @property
    def dumps(self) -> Path:
        return self.path / "flight-recorder"

    @property
    def failure_record(self) -> Path:
        return self.path / "failure.json"

    @property
    def stragglers(self) -> Path:
        """The master's last straggler table (supervise/straggler_watch.py)."""
        return self.path / "stragglers.json"

    @property
    def progress(self) -> Path:
        """Touched by a script that works quietly (hang.report_progress)."""
        return self.path / "progress"

    @property
    def nccl_trace_prefix(self) -> str:
        """Where NCCL's own dump on a collective timeout goes (`<prefix><rank>`)."""
        return f"{self.path}/nccl_trace_rank_"

    def record(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.json"

    def log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def stack(self, rank: int) -> Path:
        return self.stacks / f"rank-{rank}.txt"

    def dump(self, rank: int) -> Path:
        return self.dumps / f"rank-{rank}.json"

    def death_dump(self, rank: int) -> Path:
        """Written by the rank itself as it dies of an exception (a request's dump may replace
        `dump` meanwhile; this one stays)."""
        return self.dumps / f"exit-rank-{rank}.json"

    def internal_error(self, stamp: int) -> Path:
        return self.path / f"internal-error-{stamp}.txt"

    def records(self) -> list[Path]:
        return sorted(self.path.glob("rank-*.json"))

    def rank_logs(self) -> list[Path]:
        return sorted(self.logs.glob("rank-*.log"))

    def stack_files(self) -> list[Path]:
        return sorted(self.stacks.glob("rank-*.txt"))

    def prepare(self) -> None:
        """Our own files of a previous run in this tree removed, nothing else."""
        self.logs.mkdir(parents=True, exist_ok=True)
        for folder, pattern in (
            (self.path, "rank-*.json"),
            (self.logs, "rank-*.log"),
            (self.stacks, "rank-*.txt"),
            (self.dumps, "rank-*.json"),
            (self.dumps, "exit-rank-*.json"),
            (self.path, "nccl_trace_rank_*"),
            (self.path, "stragglers.json"),
        ):
            for stale in folder.glob(pattern):
                stale.unlink(missing_ok=True)

    def tidy(self) -> None:
        """Only what helps a user (SageMaker uploads output/data): no empty stack files or
        folders."""
        for path in self.stack_files():
            with contextlib.suppress(OSError):
                if path.stat().st_size == 0:
                    path.unlink()
        for folder in (self.stacks, self.dumps):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty


CONTROL_ROOT = Path(tempfile.gettempdir()) / "container-entry"
CONTROL_ENV = "_CONTAINER_ENTRY_CONTROL"  # tells each rank's wrapper its launch's ControlDir


@dataclass(frozen=True)
class ControlDir:
    """The control folder of one launch."""

    path: Path

    @classmethod
    def create(cls, name: str, root: Path = CONTROL_ROOT) -> ControlDir:
        """A fresh one for this process (`<root>/<pid>-<name>`, mode 0700), so tools in the
        container (`container-entry stacks`, tests) find a live launch's workers."""
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = root / f"{os.getpid()}-{name}"
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(mode=0o700)
        return cls(path)

    @staticmethod
    def live(root: Path = CONTROL_ROOT) -> list[tuple[int, ControlDir]]:
        """(bootstrap pid, folder) of every launch under `root`, by name."""
        found = []
        for path in sorted(root.glob("*-*")):
            pid, _, _ = path.name.partition("-")
            if pid.isdigit():
                found.append((int(pid), ControlDir(path)))
        return found

    @property
    def command(self) -> Path:
        return self.path / "command.json"

    @property
    def stop(self) -> Path:
        """Written by the bootstrap before it signals the workers of a stop."""
        return self.path / "stop"

    @property
    def preflight_passed(self) -> Path:
        return self.path / "preflight-passed"

    @property
    def preflight_failed(self) -> Path:
        return self.path / "preflight-failed"

    def passed_by(self, rank: int) -> Path:
        """This rank's own preflight passed (in the script's Python: the wrapper cannot tell
        a failed preflight from a failed script by the exit status alone)."""
        return self.path / f"preflight-passed-rank-{rank}"

    def pid_file(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.pid"

    def exiting(self, rank: int) -> Path:
        """When the rank's script began its exit teardown (_site/sitecustomize.py)."""
        return self.path / f"rank-{rank}.exiting"

    @property
    def torchrun_ready(self) -> Path:
        """Touched by the prestarted torchrun once its import is done and the launch came
        (supervise/_torchrun_main.py): its start-up is no script's silence (diagnose/hang.py)."""
        return self.path / "torchrun.ready"

    def started(self) -> list[Path]:
        """What marks this launch's start-up as done: torchrun ready, each rank's pid file."""
        return [self.torchrun_ready, *self.pid_files()]

    def pid_files(self) -> list[Path]:
        return sorted(self.path.glob("rank-*.pid"))

    def dump_request(self, rank: int) -> Path:
        return self.path / f"dump-rank-{rank}.fifo"

    def dump_ranks(self) -> list[int]:
        """The ranks of this host that listen for dump requests."""
        names = (p.name.removeprefix("dump-rank-").removesuffix(".fifo") for p in self._fifos())
        return sorted(int(name) for name in names if name.isdigit())

    def _fifos(self) -> list[Path]:
        return list(self.path.glob("dump-rank-*.fifo"))

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
