"""Spawn torchrun with the plan's argv and environment, forward stop signals, wait."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping

from container_entry.logs import log
from container_entry.plan import Plan

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def child_environment(plan: Plan, environ: Mapping[str, str]) -> dict[str, str]:
    """The user's environment plus the plan's additions (which never overwrite user values)."""
    env = dict(environ)
    for name, var in plan.env.items():
        env.setdefault(name, var.value)
    return env


def run(plan: Plan, environ: Mapping[str, str]) -> int:
    """Run torchrun to completion; returns its exit status (negative: killed by a signal)."""
    process = subprocess.Popen(
        list(plan.argv), env=child_environment(plan, environ), cwd=plan.code.code_dir
    )

    def forward(signum: int, _frame: object) -> None:
        log(f"received {signal.Signals(signum).name}, forwarding to the workers")
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _reap_orphans()


def _reap_orphans() -> None:
    """As PID 1 we inherit orphaned workers' zombies; collect them."""
    if os.getpid() != 1:
        return
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
