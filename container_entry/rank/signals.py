"""A rank's own stop signals: the first one noted (never a traceback, never an early death),
and the rank's end when its parent dies outside a container. The bootstrap's side is
common/stopping.py."""

from __future__ import annotations

import os
import signal
import time

from container_entry.common.exits import signal_name, signal_number
from container_entry.common.layout import ControlDir
from container_entry.common.stopping import STOP_SIGNALS, StopSignal


class RankStop:
    """The first stop this rank got, as it came (`came`: its signal and when). (A plain class
    here, no dataclass: each of those costs the wrapper's start-up most of a millisecond.)"""

    def __init__(self, came: StopSignal | None = None) -> None:
        self.came = came

    @property
    def name(self) -> str | None:
        return self.came.name if self.came else None

    @property
    def at(self) -> float | None:
        return self.came.at if self.came else None

    @classmethod
    def noted(cls, early: dict[int, float]) -> RankStop:
        """Noting from now on (never a traceback, never an early death), with what the module's
        first lines noted while it loaded (`early`: {signal: when})."""
        stop = cls()
        for sig in STOP_SIGNALS:
            signal.signal(sig, stop.note)
        if early:
            signum, at = min(early.items(), key=lambda item: item[1])
            stop.came = StopSignal(signal_name(signum), at)
        return stop

    def note(self, signum: int, _frame: object = None) -> None:
        if self.came is None:
            self.came = StopSignal(signal_name(signum), time.time())

    def requested(self, control: ControlDir) -> bool:
        """A stop was signalled to this rank, or came before torchrun started it: the
        bootstrap writes the stop, as it came, to the stop file before it signals the workers,
        so the signal recorded is the one that came (SIGINT, SIGHUP), never one assumed."""
        if self.came is None:
            try:
                text = control.stop.read_text(encoding="ascii", errors="replace")
            except OSError:
                return False
            self.came = StopSignal.read(text) or StopSignal("SIGTERM", time.time())
        return True

    @property
    def signum(self) -> int:
        return signal_number(self.name or "SIGTERM") or signal.SIGTERM


ORPHAN_SIGNAL = signal.SIGRTMIN + 3  # PR_SET_PDEATHSIG: the kernel's word that torchrun died
_PR_SET_PDEATHSIG = 1


def end_with_parent() -> None:
    """Outside a container nothing ends a rank whose bootstrap was SIGKILLed (torchrun then dies
    with it, by its own PR_SET_PDEATHSIG; its workers run in sessions of their own): the kernel
    signals this wrapper when its parent dies, and the wrapper kills its process group, which
    holds the script. A real-time signal nobody else sends, and only acted on once the parent
    really changed (the kernel also sends it when the thread that started us ends)."""
    parent = os.getppid()

    def orphaned(_signum: int, _frame: object) -> None:
        if os.getppid() != parent:
            os.killpg(os.getpgrp(), signal.SIGKILL)

    signal.signal(ORPHAN_SIGNAL, orphaned)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(ORPHAN_SIGNAL))
    except (OSError, AttributeError):
        return
    orphaned(ORPHAN_SIGNAL, None)  # it died before that took


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphans below this process are adopted by it, not by PID 1: the workers that an entry
    point's own launcher started stay in this rank's tree (signalled, awaited, killed with it)
    when that launcher dies first."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except (OSError, AttributeError):
        return
