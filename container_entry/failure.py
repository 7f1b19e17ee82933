"""Outcome files SageMaker reads: <base>/output/success, <base>/output/failure."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from container_entry.logs import log, redact

# SageMaker shows this many characters of the failure file as the job's FailureReason.
FAILURE_REASON_LIMIT = 1024


def describe_exit(code: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a negative (killed) return code."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def container_exit_code(code: int) -> int:
    """A process killed by signal N is reported as 128+N, the shell's convention."""
    return 128 - code if code < 0 else code


class Outcome:
    """Writes the outcome once; keeps a failure file the user's script wrote during this run."""

    def __init__(self, base_dir: Path) -> None:
        self.output = base_dir / "output"
        self.started = time.time()

    def _write(self, name: str, text: str) -> None:
        try:
            self.output.mkdir(parents=True, exist_ok=True)
            (self.output / name).write_text(text, encoding="utf-8")
        except OSError as error:
            log(f"cannot write {self.output / name}: {error.strerror}")

    def success(self) -> None:
        self._write("success", "")

    def failure(self, message: str) -> None:
        path = self.output / "failure"
        try:
            if path.stat().st_mtime >= self.started:
                log(f"keeping the failure file the script wrote: {path}")
                return
        except OSError:
            pass
        self._write("failure", redact(message).rstrip("\n") + "\n")
