"""Hang watchdog: a job whose ranks, on every host, stopped printing and stopped reporting
progress for HANG_TIMEOUT seconds is declared hung and torn down (exit code 124), instead of
billing until SageMaker's MaxRuntimeInSeconds.

What counts as a sign of life on a host: any line a rank printed (its wrapper appends it to
`<run dir>/logs/rank-N.log`, so that file's mtime is the time of the rank's last line) or a
touch of the progress file (`CONTAINER_ENTRY_PROGRESS_FILE`, or `report_progress()` below) by
a script that works quietly; and, once each, the steps of the start-up (torchrun's import done,
each rank's start: a fixed timeout does not count torchrun's own start-up as the script's
silence; the script's start-up, its imports, it does). One host decides alone;
several hosts send their idle seconds with each heartbeat and the master declares the hang
only when every host is idle (hosts.liveness). Stdlib only, no side effects on import: user
scripts import `report_progress` from here (through `container_entry.hang`).

HANG_TIMEOUT=auto (the default) watches multi-host jobs (`Silence`): once every host's ranks
printed (start-up, a model download, is never a hang), the job is hung when it has been silent
for max(AUTO_FLOOR, AUTO_FACTOR x the longest silence it already came back from): a job that
prints every few seconds is hung after 30 minutes of silence, one that once checkpointed
silently for 20 minutes only after an hour. A single host is not watched unless HANG_TIMEOUT is
set (NCCL's own watchdog ends a hung collective there).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from container_entry.common.exits import ExitCode
from container_entry.common.layout import RunDir
from container_entry.diagnose.failure import HUNG

PROGRESS_ENV = "CONTAINER_ENTRY_PROGRESS_FILE"
CHECK_SECONDS = 1.0  # how often a host measures its idle time
AUTO_FLOOR = 1800.0  # seconds: HANG_TIMEOUT=auto never declares a shorter silence a hang
AUTO_FACTOR = 3.0  # x the longest silence the job came back from


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


def is_hang(record: object) -> bool:
    """A relayed record that is the hang verdict (no rank's own exit)."""
    return (
        getattr(record, "rank", 0) is None
        and getattr(record, "returncode", 0) == ExitCode.HUNG
        and str(getattr(record, "what", "") or "").startswith(HUNG)
    )


class Activity:
    """When this host's ranks last showed life, from file times only (no wake-up per line).
    The start-up's steps are life too (`started`: torchrun's import done, each rank's pid file
    as its wrapper starts the script), and so is every moment torchrun has started no worker
    yet (`starting`): the silence of a fixed HANG_TIMEOUT counts from the last of them, so
    torchrun's own start-up (its import of torch, 11 s on a busy machine: run 52 in
    docs/test-speed.md; its rendezvous and the workers' start after it, over 10 s in run 56)
    is not taken for the script's silence; the script's own start-up is."""

    def __init__(
        self,
        run_dir: RunDir,
        progress: str | None,
        started: Callable[[], Sequence[Path]] = tuple,
        starting: Callable[[], bool] = lambda: False,
    ) -> None:
        self.run_dir = run_dir
        self.progress = progress
        self.started = started  # the start-up's marks (ControlDir.started)
        self.starting = starting  # no worker yet (Supervisor.torchrun_starting)
        self._starting_at = 0.0  # when `starting` was last seen true
        self.since = time.time()  # the launch
        self._checked = 0.0
        self._idle = 0.0
        self.printed = False  # a rank printed or reported progress since the launch

    def idle(self) -> float:
        """Seconds since the last line or progress report of any local rank, or since the
        ranks started (re-measured at most every CHECK_SECONDS)."""
        now = time.time()
        if now - self._checked >= CHECK_SECONDS:
            latest = started = self.since
            paths: list[Path | str] = [*self.run_dir.rank_logs()]
            paths += [self.progress] if self.progress else []
            for path in paths:
                with contextlib.suppress(OSError):
                    latest = max(latest, os.stat(path).st_mtime)
            for path in self.started():
                with contextlib.suppress(OSError):
                    started = max(started, os.stat(path).st_mtime)
            if self.starting():
                self._starting_at = now
            started = max(started, self._starting_at)
            self.printed = self.printed or latest > self.since
            self._checked, self._idle = now, max(0.0, now - max(latest, started))
        return self._idle + (now - self._checked)

    def idle_since_printing(self) -> float | None:
        """`idle`, or None while no rank printed yet (HANG_TIMEOUT=auto waits for that)."""
        idle = self.idle()
        return idle if self.printed else None


class Silence:
    """The job's silence as the master sees it (the least idle of its hosts, every second) and
    the timeout it allows: HANG_TIMEOUT's seconds, or for `auto` (None) max(AUTO_FLOOR,
    AUTO_FACTOR x the longest silence the job already came back from)."""

    def __init__(self, timeout: float | None) -> None:
        self.fixed = timeout
        self.current = 0.0
        self.longest = 0.0  # the longest silence that ended in output

    def timeout(self) -> float:
        if self.fixed is not None:
            return self.fixed
        return max(AUTO_FLOOR, AUTO_FACTOR * self.longest)

    def hung(self, silence: float) -> bool:
        """Whether `silence` (now) is a hang; also learns from it."""
        if silence < self.current:  # output came: that silence ended
            self.longest = max(self.longest, self.current)
        self.current = silence
        timeout = self.timeout()
        return bool(timeout) and silence >= timeout
