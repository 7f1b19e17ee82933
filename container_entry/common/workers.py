"""This host's worker processes, as the launcher sees and signals them.

torchrun starts each worker wrapper in a session of its own, so each of torchrun's children is a
worker's process group (the wrapper and its script); each wrapper announces its processes in the
control folder (`WorkerPids`). From those two sources the launcher signals, asks for stacks and
kills the workers without torchrun's help.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from container_entry.common.layout import ControlDir
from container_entry.common.records import WorkerPids

GONE_SECONDS = 5.0  # for killed ranks to be gone before the launcher exits


def children(pid: int) -> list[int]:
    """The live (not yet exited) child processes of `pid`, from /proc."""
    found: list[int] = []
    for tasks in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(child) for child in tasks.read_text().split()]
    return [child for child in found if not exited(child)]


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`: its children, theirs, and so on (from /proc)."""
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children(queue.pop()):
            if child not in found:
                found.append(child)
                queue.append(child)
    return found


def groups_below(pid: int) -> set[int]:
    """The process groups of `pid`'s descendants, but `pid`'s own: a launcher the script runs
    (torchrun, accelerate launch) starts each of its workers in a session of its own, which a
    signal to the rank's own group never reaches."""
    groups = set()
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(child))
    with contextlib.suppress(OSError):
        groups.discard(os.getpgid(pid))
    return groups


def signal_tree(pid: int, sig: signal.Signals, done: set[int] | None = None) -> None:
    """`sig` to the process group `pid` leads and to every other group among its descendants,
    each once (`done`: the groups already signalled, kept by the caller across calls)."""
    done = set() if done is None else done
    for group in [pid, *sorted(groups_below(pid))]:
        if group not in done:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
            done.add(group)


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash"})  # a shell's process name


def _is_shell(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() in SHELLS
    except OSError:
        return False


def stop_launched(pid: int, sig: signal.Signals, done: set[int]) -> None:
    """A stop for a tree of processes the user's own launcher started (the entry point once on
    its host, SDK v3's start as it is, the base image's toolkit): `sig` to `pid` and every
    process below it, but a launcher that has no handler for it while its workers run. It ends
    with them, as a launcher waits for its workers and reports them (the toolkit writes its
    failure file); its death would cut their checkpoint (torch.multiprocessing.spawn's workers
    get SIGINT when their parent dies). A shell dies of it, as a shell does: it goes on to no
    further command; what it started goes on to the end of its own handler. Each process once
    (`done`: the pids already signalled, kept across calls, so one that appears later gets it
    too)."""
    for process in [pid, *descendants(pid)]:
        if process in done:
            continue
        if not catches(process, sig) and children(process) and not _is_shell(process):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process, sig)
        done.add(process)


def childless(pid: int) -> bool:
    """Running, with no live child process (from /proc: no wait, no reaping)."""
    return not exited(pid) and not children(pid)


def exited(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def wait_exited(pids: Sequence[int], timeout: float) -> None:
    """Until every one of `pids` has exited (a SIGKILL is delivered, not yet done, when kill()
    returns), or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while any(not exited(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.01)


def catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler installed for `sig` (its SigCgt mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


class Workers:
    """The ranks this host's torchrun started, as their wrappers announced them."""

    def __init__(self, control: ControlDir) -> None:
        self.control = control
        self.known: dict[int, WorkerPids] = {}

    def refresh(self) -> dict[int, WorkerPids]:
        for path in self.control.pid_files():
            pids = WorkerPids.read(path)
            if pids is not None:
                self.known[pids.rank] = pids
        return self.known

    def signal(self, sig: signal.Signals, ranks: Sequence[int] | None = None) -> None:
        """`sig` to every rank's processes: its group and the groups of what it started."""
        for rank, pids in self.refresh().items():
            if ranks is None or rank in ranks:
                signal_tree(pids.wrapper, sig)

    def kill(self, torchrun: int) -> None:
        """SIGKILL every worker's processes: those announced and torchrun's children (a wrapper
        killed before it announced itself), each with every group below it."""
        wrappers = {pids.wrapper for pids in self.refresh().values()} | set(children(torchrun))
        trees = {wrapper: groups_below(wrapper) for wrapper in wrappers}  # before any is killed
        for wrapper, groups in trees.items():
            for group in (wrapper, *groups):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)

    def request_stacks(self) -> dict[int, bool]:
        """Ask every live rank to write all its threads' Python stacks (faulthandler on SIGUSR2,
        registered by _site/sitecustomize.py); {rank: whether it was asked}. SIGUSR2's default
        action ends a process, so a rank without that handler (a shell entry script, a Python
        still starting) is never sent it."""
        asked: dict[int, bool] = {}
        for rank, pids in self.refresh().items():
            asked[rank] = False
            if catches(pids.child, signal.SIGUSR2):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pids.child, signal.SIGUSR2)
                    asked[rank] = True
        return asked

    def wait_gone(self, timeout: float = GONE_SECONDS) -> None:
        """Until every known rank process has exited (a SIGKILL is delivered, not yet done,
        when kill() returns): nothing of the job outlives the launcher. Bounded."""
        wait_exited([pid for p in self.known.values() for pid in (p.wrapper, p.child)], timeout)

    def capture_stacks(self, wait: float = 0.5) -> None:
        """Every rank's stacks on disk before it is torn down."""
        if any(self.request_stacks().values()):
            time.sleep(wait)


def adopted(child: int) -> list[int]:
    """This process's live children but `child`: the processes a subreaper took in when their
    parent died (an entry point's workers, after it died of a stop)."""
    return [pid for pid in children(os.getpid()) if pid != child]


def reap_adopted(child: int) -> None:
    """Collect the exit of every adopted process but `child` (whose status its Popen keeps)."""
    for tasks in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        with contextlib.suppress(OSError, ValueError):
            for pid in (int(p) for p in tasks.read_text().split()):
                if pid != child:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)


def reap_orphans() -> None:
    """As PID 1 we inherit orphaned processes' zombies; collect them."""
    if os.getpid() != 1:
        return
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
