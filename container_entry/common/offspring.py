"""The bootstrap's child processes: none outlives it.

Before the workers start, a stop raises StopRequested wherever the bootstrap is (stopping.py),
so it can land between a child's fork and the moment its Popen is kept: inside
`subprocess.Popen` (which then neither kills nor waits for the child), or before the object
reaches its owner (the prestarted torchrun). A child lost that way ran on after the bootstrap
had exited (seen under load: a stop 200 ms into the start left the prestarted torchrun
importing torch). Two pieces close the class, whoever started the child and wherever the stop
landed:

- `run`: the bootstrap's short helpers (nvidia-smi, the GPU check, pip) each in a process group
  of its own, killed as a group on any exception or timeout: pip's own children go with it
  (subprocess.run kills the direct child only);
- `end_all`: the bootstrap's last step kills every child still alive, with its process group
  where it leads one, and reaps it.

As PID 1 the kernel kills what is left at the bootstrap's exit anyway; outside a container
(`python -m container_entry`, a developer's shell, the tests) nothing else would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

from container_entry.common.workers import GONE_SECONDS, children, wait_exited


def run(
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    check: bool = False,
    capture_output: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess:
    """`subprocess.run` for a helper, in its own process group, which any exception (a stop,
    TimeoutExpired) kills whole before it propagates."""
    if capture_output:
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with subprocess.Popen(list(argv), process_group=0, **popen) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            _kill_group(process.pid)
            process.wait()
            raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, list(argv), stdout, stderr)
    return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)


def end_all(timeout: float = GONE_SECONDS) -> list[int]:
    """Kill every live child of this process (its process group too, where it leads one) and
    reap them; returns their pids (none when every part of the bootstrap cleaned up)."""
    left = children(os.getpid())
    for pid in left:
        _kill_group(pid)
    wait_exited(left, timeout)
    for pid in left:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)
    return left


def _kill_group(pid: int) -> None:
    """SIGKILL to `pid`'s process group where it leads one of its own, else to `pid`."""
    with contextlib.suppress(OSError):
        if os.getpgid(pid) == pid and pid != os.getpgrp():
            os.killpg(pid, signal.SIGKILL)
            return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
