"""A start that is not ours to shape, run as it is under our stop: SDK v3's own start (`command=`,
its MPI driver, the opt-out) and the base image's own SageMaker toolkit (`distribution=` asking
for MPI, the model-parallel library, XLA).

The bootstrap stays PID 1 and runs it as its child, in a process group of its own: PID 1 bash
or Python would drop a stop (SageMaker then kills the job 120 s later with no checkpoint).
A stop is sent to each of its processes that handles it or has no child (a shell or launcher
that would die of it is left to end with its workers: common.workers.stop_launched), which then
have STOP_GRACE_PERIOD to exit before SIGKILL; the job exits 128+N with a failure file.
Otherwise the child's own exit status is the job's, and its own success or failure file
stands.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from container_entry.common.exits import of_returncode, stopped_exit_code
from container_entry.common.logs import log
from container_entry.common.stopping import Stop
from container_entry.common.workers import (
    descendants,
    groups_below,
    reap_adopted,
    stop_launched,
)
from container_entry.diagnose.failure import stopped_line, unchanged_stop_words
from container_entry.supervise.ending import Verdict
from container_entry.supervise.outcome import Outcome

POLL_SECONDS = 0.5


def _alive(pid: int) -> bool:
    """The child's group, or anything it started, still runs."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return bool(descendants(pid))
    except PermissionError:
        return True
    return True


def run_unchanged(
    argv: Sequence[str],
    environ: Mapping[str, str],
    stop: Stop,
    outcome: Outcome,
    grace: float,
    what: str,
) -> int:
    """`argv` exactly as it would have run (`what` names it in our lines): its exit status, or
    128+N after a stop (`stop`, installed by the caller, never raising here)."""
    stop.workers_started()  # every stop is the child's to answer
    if stop.signal is not None:
        words = unchanged_stop_words(stop.signal, what, None)
        log(words)
        return outcome.write(Verdict(stopped_exit_code(stop.signal), stopped_line(words), []))
    signalled: set[int] = set()
    with stop.wakes_on_child_exit():
        child = subprocess.Popen(list(argv), process_group=0, env=dict(environ))
        sent: float | None = None
        while True:
            child.poll()
            reap_adopted(child.pid)  # as PID 1, the orphans it left (never its own status)
            if sent is None and child.returncode is not None:
                break
            if sent is None and stop.signal is not None:
                log(f"{stop.signal}: sent to {what} (its processes have {grace:g} s)")
                sent = time.monotonic()
            if sent is not None:
                stop_launched(child.pid, signal.Signals[stop.signal or "SIGTERM"], signalled)
                if child.returncode is not None and not _alive(child.pid):
                    break
                if time.monotonic() - sent > grace:
                    log(f"{what} still ran {grace:g} s after the stop: killed")
                    for group in {child.pid, *groups_below(child.pid)}:
                        with contextlib.suppress(OSError):
                            os.killpg(group, signal.SIGKILL)
                    child.wait()
                    break
            stop.wait(POLL_SECONDS)
    stop.after_workers()
    if sent is not None:
        waited = time.monotonic() - sent
        words = unchanged_stop_words(stop.signal, what, waited)
        log(words)
        return outcome.write(Verdict(stopped_exit_code(stop.signal), stopped_line(words), []))
    return of_returncode(child.returncode)
