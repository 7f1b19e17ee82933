"""Taking this host's ranks down, one small object per way: `start` once, `step` at every look
of the supervisor until `deadline`, then `force`. Which one runs is the ending's business
(ending.ending_of); these only do it.

- `Stopping` (a stop, here or on another host): the bootstrap delivers the signal itself and
  torchrun never gets one while ranks run (supervisor.py says why: its 30 s kill before torch
  2.12, and the job's store it hosts, which NCCL's heartbeat thread polls until a rank exits);
- `Winding` (a failure here or elsewhere, a lost master): stacks first, then torchrun told to
  end its ranks, killed after FAILURE_GRACE_PERIOD;
- `Hanging` (the hang watchdog, or a collective that timed out here or elsewhere): as
  `Winding`, after the stacks and every rank's flight-recorder records are on disk (and, with
  several hosts, at the master for the culprit).
"""

from __future__ import annotations

import contextlib
import math
import signal
import subprocess
import time
from collections.abc import Callable

from container_entry.common.layout import ControlDir, RunDir
from container_entry.common.logs import log
from container_entry.common.stopping import StopSignal
from container_entry.common.workers import Workers, children, signal_tree, stop_launched
from container_entry.diagnose import flight_recorder
from container_entry.diagnose.culprit import ranges
from container_entry.supervise.ending import Observed

# Once its ranks are gone torchrun has nothing left to do but wait at its exit barrier, in a
# store call that no Python signal handler interrupts until the store answers (up to 300 s:
# measured, a SIGTERM to a process in TCPStore.wait is handled only when the wait times out).
# So it gets this long after its SIGTERM, then SIGKILL.
TORCHRUN_EXIT_SECONDS = 1.0


class Teardown:
    deadline: float = math.inf

    def __init__(self, process: subprocess.Popen, workers: Workers, observed: Observed) -> None:
        self.process = process
        self.workers = workers
        self.observed = observed

    def start(self, now: float) -> None:
        raise NotImplementedError

    def step(self, now: float) -> None:
        """Nothing to do until the deadline (torchrun ends its ranks itself)."""

    def force(self) -> None:
        """The deadline passed: kill what is left. Ranks still running then are the news
        (their stacks first); torchrun slow to exit after its ranks is not."""
        if children(self.process.pid):
            log("grace period over: recording stacks, killing the remaining workers")
            self.workers.capture_stacks()
            self.observed.forced_kill = True
        self.workers.kill(self.process.pid)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def _end_torchrun(self, now: float, within: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        self.deadline = now + within


class Winding(Teardown):
    def __init__(
        self,
        process: subprocess.Popen,
        workers: Workers,
        observed: Observed,
        grace: float,
        message: str,
        tell: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(process, workers, observed)
        self.grace = grace
        self.message = message
        self.tell = tell  # the other hosts, of a failure of this host's

    def start(self, now: float) -> None:
        log(self.message)
        if self.tell is not None:
            self.tell()
        self.record()
        self.observed.grace = self.grace
        self._end_torchrun(now, self.grace)

    def record(self) -> None:
        self.workers.capture_stacks()


class Hanging(Winding):
    def __init__(
        self,
        process: subprocess.Popen,
        workers: Workers,
        observed: Observed,
        grace: float,
        message: str,
        control: ControlDir,
        run_dir: RunDir,
        share: Callable[[], None] | None = None,
        tell: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(process, workers, observed, grace, message, tell)
        self.control = control
        self.run_dir = run_dir
        self.share = share  # the records to the master, for the culprit across hosts

    def record(self) -> None:
        """Where every rank is stuck, before any is stopped: Python stacks (faulthandler dumps
        even while the main thread waits in native code) and each rank's flight-recorder
        records (NCCL's and gloo's), awaited until complete (bounded)."""
        self.workers.capture_stacks(wait=1.0)
        ranks = sorted(self.workers.refresh())
        landed = flight_recorder.collect(self.control, self.run_dir, ranks)
        if missing := [rank for rank in ranks if rank not in landed]:
            log(
                f"no flight-recorder records from rank(s) {ranges(missing)} within "
                f"{flight_recorder.WAIT_SECONDS:g} s (not a Python rank, gone, or not answering)"
            )
        if self.share is not None:
            self.share()


class Stopping(Teardown):
    def __init__(
        self,
        process: subprocess.Popen,
        workers: Workers,
        observed: Observed,
        grace: float,
        control: ControlDir,
        peers_running: Callable[[], bool] | None = None,
        stopped: str | None = None,
        once: bool = False,
    ) -> None:
        super().__init__(process, workers, observed)
        self.grace = grace
        self.control = control
        self.stopped = stopped  # another host's stop, in words; None: this host's own
        self.peers_running = peers_running  # the master's: its torchrun hosts the job's store
        # the entry point once on this host: its launcher's processes are stopped one by one
        # (common.workers.stop_launched), else every worker's process groups
        self.deliver = stop_launched if once else signal_tree
        self.signalled: set[int] = set()  # process groups, or processes, signalled
        self.delivering = True
        self.waiting_for_peers = False

    def start(self, now: float) -> None:
        came = self.observed.stop or StopSignal("SIGTERM", time.time())
        stop = came.name
        cause = f"{self.stopped}: this host's ranks get its {stop}" if self.stopped else None
        log(f"{cause or f'received {stop}'}: stopping every rank (grace period {self.grace:g} s)")
        with contextlib.suppress(OSError):  # before any signal: no new worker runs anything,
            self.control.stop.write_text(came.text())  # and each rank records this stop
        self.observed.stop = came
        self.observed.grace = self.grace
        self.deadline = now + self.grace
        self.step(now)

    def step(self, now: float) -> None:
        """Every worker group torchrun has gets the signal once (a wrapper it starts later
        finds the stop file and runs nothing); once they are all gone, and on the master every
        other host's too (within the grace), torchrun is ended."""
        if not self.delivering:
            return
        self.observed.launched |= set(self.workers.refresh())
        sig = signal.Signals(self.observed.stop.number if self.observed.stop else signal.SIGTERM)
        running = children(self.process.pid)
        for wrapper in running:  # and what it started in groups of its own, as they appear
            self.deliver(wrapper, sig, self.signalled)
        if running:
            return
        if self.peers_running is not None and now < self.deadline and self.peers_running():
            if not self.waiting_for_peers:
                log("this host's ranks exited; keeping the job's store up for the other hosts")
                self.waiting_for_peers = True
            return
        self.delivering = False
        self._end_torchrun(now, TORCHRUN_EXIT_SECONDS)  # no worker left: it only ends
