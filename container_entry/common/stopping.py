"""Stop signals (SIGTERM from StopTrainingJob, Spot or `docker stop`; SIGINT; SIGHUP).

The handler only does what is safe at any point of the main thread: it records the first signal
in plain attributes and, through the wakeup pipe, ends whatever wait the main loop is in. Before
the workers start it also raises StopRequested, so a stop ends the host wait, the join or a
requirements install at once (as PID 1 in a container an unhandled SIGTERM is ignored, and the
job would only end at SageMaker's SIGKILL). It never takes a lock: a handler that set a
threading.Event while the main thread was inside that Event's wait deadlocked.

The first moments: Python itself turns SIGINT into KeyboardInterrupt wherever the main thread
is, and SIGTERM/SIGHUP kill a process without a handler (outside a container). So the
bootstrap's very first line of code (`container_entry.cli`, before it imports anything else)
calls `record_early`, whose handler only notes the signal; `Stop.install` takes it over, and the
training command then ends as a stopped job (128+N, a failure file) instead of a traceback.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

from container_entry.common.errors import StopRequested
from container_entry.common.exits import of_signal, signal_name, signal_number

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class StopSignal:
    """A stop as it came: the signal (its name, `SIGTERM`) and the moment (epoch seconds). The
    one type a stop travels in: from the bootstrap's handler (`Stop.came`) to what the run saw
    (`Observed.stop`), to every rank (the control folder's stop file, `text`/`read`), in each
    rank's record and to the other hosts (`RankRecord.stop`)."""

    name: str
    at: float

    @property
    def number(self) -> int:
        return signal_number(self.name) or int(signal.SIGTERM)

    @property
    def exit_code(self) -> int:
        """What a job stopped by it exits with: 128+N (143 SIGTERM, 130 SIGINT, 129 SIGHUP)."""
        return of_signal(self.number)

    def text(self) -> str:
        return f"{self.name} {self.at!r}"

    @classmethod
    def read(cls, text: str) -> StopSignal | None:
        """The stop file's content; None for what no stop writes."""
        name, _, at = text.strip().partition(" ")
        try:
            moment = float(at)
        except ValueError:
            return None
        return cls(name, moment) if signal_number(name) is not None else None

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "at": self.at}

    @classmethod
    def from_json(cls, data: object) -> StopSignal | None:
        if isinstance(data, StopSignal) or data is None:
            return data
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            at = data.get("at")
            return cls(data["name"], float(at) if isinstance(at, int | float) else 0.0)
        return None


class _Early:
    """The first stop signal that `record_early`'s handler saw."""

    signal: str | None = None
    number: int = 0
    at: float | None = None

    @classmethod
    def clear(cls) -> None:
        cls.signal, cls.number, cls.at = None, 0, None


# the handlers `record_early` replaced (signal.signal's return values)
_early_previous: dict[int, signal._HANDLER] = {}


def _note_early(signum: int, _frame: object) -> None:
    if _Early.signal is None:
        _Early.signal, _Early.number, _Early.at = signal_name(signum), signum, time.time()


def note_early(signum: int) -> None:
    """A stop that reached an earlier program of the container's start (the SDK hook's shell,
    docker/sdk-hook.bash) before it exec'd the bootstrap: as if it had come now."""
    _note_early(signum, None)


def record_early() -> None:
    """Catch the stop signals at once, before anything else is imported: only noted, never
    raised (a KeyboardInterrupt inside an import would be a traceback). `Stop.install` takes
    over what was noted; `release_early` hands it back to a command that does not train.

    Then they are unblocked: a container entry point that starts the bootstrap with them
    blocked (`env --block-signal=INT,TERM,HUP container-entry`) leaves no moment at all in
    which a stop is lost or a KeyboardInterrupt (Python's own start-up before this line, its
    site and runpy imports, takes tens of milliseconds): one that came meanwhile is pending,
    and noted now.

    The bootstrap's first line is, seen from outside, the moment a stop signal is caught: from
    then on none of them may find Python's KeyboardInterrupt or the default action."""
    with contextlib.suppress(ValueError, OSError):  # not the main thread: nothing to do
        for sig, previous in catch_together(_note_early).items():
            _early_previous.setdefault(sig, previous)
    with contextlib.suppress(ValueError, OSError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def catch_together(handler: signal._HANDLER) -> dict[int, signal._HANDLER]:
    """`handler` for every stop signal, installed while all of them are blocked (the signal mask
    is then as it was): one by one, a SIGINT that came once SIGTERM was caught but before SIGINT
    was would be Python's KeyboardInterrupt. Blocked, it waits and lands in `handler`. Returns
    the handlers it replaced."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def release_early() -> None:
    """For a command other than `train`: the handlers as they were (SIGINT is Python's
    KeyboardInterrupt again), and a signal that came meanwhile delivered again under them."""
    for sig, previous in _early_previous.items():
        with contextlib.suppress(ValueError, OSError, TypeError):
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
    _early_previous.clear()
    if _Early.signal is not None:
        number = _Early.number
        _Early.clear()
        signal.raise_signal(number)


class Stop:
    def __init__(self) -> None:
        self.came: StopSignal | None = None  # the first stop signal, as it came
        self.raising = True  # until the workers start
        self.cut_start = False  # a stop came before the workers started
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._previous: dict[int, signal._HANDLER] = {}

    @property
    def signal(self) -> str | None:
        return self.came.name if self.came else None

    @property
    def at(self) -> float | None:
        return self.came.at if self.came else None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            previous = signal.signal(sig, self._handle)
            if previous is _note_early:  # the early recorder's: the handler before it
                previous = _early_previous.get(sig, signal.SIG_DFL)
            self._previous.setdefault(sig, previous)
        _early_previous.clear()
        if _Early.signal is not None and self.came is None:  # it came before this handler
            self.came = StopSignal(_Early.signal, _Early.at or time.time())
            self.cut_start = True
            with contextlib.suppress(OSError):
                os.write(self._write, b"\0")
        _Early.clear()

    def check(self) -> None:
        """Raise StopRequested for a stop that came before `install` (its handler could not)."""
        if self.signal is not None and self.raising:
            raise self.requested()

    def requested(self) -> StopRequested:
        """The stop as the bootstrap reports it before the workers start."""
        return StopRequested(
            f"stopped by {self.signal} before the workers started", self.signal or "SIGTERM"
        )

    def _handle(self, signum: int, _frame: object) -> None:
        first = self.came is None
        if first:
            self.came = StopSignal(signal_name(signum), time.time())
        with contextlib.suppress(OSError):
            os.write(self._write, b"\0")
        if first and self.raising:
            self.cut_start = True
            raise self.requested()

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

    def workers_started(self) -> None:
        """From now on a stop is the workers' to answer (the monitor delivers it): noted, never
        raised."""
        self.raising = False

    def reporting(self) -> None:
        """The run ended before its workers could answer a stop: a stop now must not interrupt
        the report; it is noted (the report says so where it matters)."""
        self.raising = False

    def after_workers(self) -> None:
        """The workers have finished and the outcome is written: a stop now changes nothing."""
        self.raising = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, _late_stop)


_late: list[str] = []  # a stop that came after the workers finished (nothing left to stop)


def _late_stop(signum: int, _frame: object) -> None:
    from container_entry.common.logs import log

    _late.append(signal_name(signum))
    log(f"received {signal_name(signum)} after the workers finished: finishing up")


def stopped_late() -> bool:
    """A stop came after the workers finished: what is left to wait for (the coordinator
    serving the other hosts) ends now."""
    return bool(_late)
