"""Stop signals (SIGTERM from StopTrainingJob, Spot or `docker stop`; SIGINT; SIGHUP).

The handler only does what is safe at any point of the main thread: it records the first signal
in plain attributes and, through the wakeup pipe, ends whatever wait the main loop is in. Before
the workers start it also raises StopRequested, so a stop ends the host wait, the join or a
requirements install at once (as PID 1 in a container an unhandled SIGTERM is ignored, and the
job would only end at SageMaker's SIGKILL). It never takes a lock: a handler that set a
threading.Event while the main thread was inside that Event's wait deadlocked.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterator
from typing import Any

from container_entry.errors import StopRequested

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stop:
    def __init__(self) -> None:
        self.signal: str | None = None
        self.at: float | None = None
        self.raising = True  # until the workers start
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            self._previous.setdefault(sig, signal.signal(sig, self._handle))

    def _handle(self, signum: int, _frame: object) -> None:
        first = self.signal is None
        if first:
            self.signal = signal.Signals(signum).name
            self.at = time.time()
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")
        if first and self.raising:
            raise StopRequested(f"stopped by {self.signal} before the workers started")

    @contextlib.contextmanager
    def wakes_on_child_exit(self) -> Iterator[None]:
        """Also end `wait` when a child process exits (SIGCHLD through the wakeup pipe)."""
        previous = signal.signal(signal.SIGCHLD, lambda *_: None)
        old_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(old_fd)
            signal.signal(signal.SIGCHLD, previous)

    def wait(self, timeout: float) -> None:
        """Sleep until a signal arrives or `timeout` passes."""
        with contextlib.suppress(InterruptedError):
            select.select([self._read], [], [], max(0.0, timeout))
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self._read, 512):
                pass

    def after_workers(self) -> None:
        """The workers have finished and the outcome is written: a stop now changes nothing."""
        self.raising = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, _late_stop)


def _late_stop(signum: int, _frame: object) -> None:
    from container_entry.logs import log

    log(f"received {signal.Signals(signum).name} after the workers finished: finishing up")
