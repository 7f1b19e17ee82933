"""Hang watchdog: a job whose ranks, on every host, stopped printing and stopped reporting
progress for HANG_TIMEOUT seconds is declared hung and torn down (exit code 124), instead of
billing until SageMaker's MaxRuntimeInSeconds.

What counts as a sign of life on a host: any line a rank printed (its wrapper appends it to
`<run dir>/logs/rank-N.log`, so that file's mtime is the time of the rank's last line) or a
touch of the progress file (`CONTAINER_ENTRY_PROGRESS_FILE`, or `report_progress()` below) by
a script that works quietly. One host decides alone; several hosts send their idle seconds with
each heartbeat and the master declares the hang only when every host is idle
(coordination.Coordinator). Stdlib only, no side effects on import: user scripts import
`report_progress` from here.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from container_entry.exits import ExitCode
from container_entry.layout import RunDir

PROGRESS_ENV = "CONTAINER_ENTRY_PROGRESS_FILE"
CHECK_SECONDS = 1.0  # how often a host measures its idle time


def report_progress() -> None:
    """For a script that may be silent longer than HANG_TIMEOUT (a long evaluation, a quiet
    loop): call it now and then; a no-op outside container-entry."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    with contextlib.suppress(OSError):
        with open(path, "ab"):
            pass
        os.utime(path)


def hung_text(timeout: float, hosts: int = 1) -> str:
    """The failure file's first line."""
    where = " on any host" if hosts > 1 else ""
    return f"hung: no output from any rank{where} for {timeout:g} s"


def is_hang(record: object) -> bool:
    """A relayed record that is the hang verdict (no rank's own exit)."""
    return (
        getattr(record, "rank", 0) is None
        and getattr(record, "returncode", 0) == ExitCode.HUNG
        and str(getattr(record, "what", "") or "").startswith("hung:")
    )


class Activity:
    """When this host's ranks last showed life, from file times only (no wake-up per line)."""

    def __init__(self, run_dir: RunDir, progress: str | None) -> None:
        self.run_dir = run_dir
        self.progress = progress
        self.since = time.time()  # the launch: start-up counts as activity
        self._checked = 0.0
        self._idle = 0.0

    def idle(self) -> float:
        """Seconds since the last line or progress report of any local rank (re-measured at
        most every CHECK_SECONDS)."""
        now = time.time()
        if now - self._checked >= CHECK_SECONDS:
            latest = self.since
            paths: list[Path | str] = [*self.run_dir.rank_logs()]
            paths += [self.progress] if self.progress else []
            for path in paths:
                with contextlib.suppress(OSError):
                    latest = max(latest, os.stat(path).st_mtime)
            self._checked, self._idle = now, max(0.0, now - latest)
        return self._idle + (now - self._checked)
