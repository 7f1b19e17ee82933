"""`container-entry sagemaker-sdk STOP SHELL -c STRING`: SDK v3's start, handed over by the hook.

docker/sdk-hook.bash runs this in place of the PID 1 bash that SageMaker SDK v3 starts
(`ModelTrainer` with `source_code`), with the shell's own argv and the stop signal it noted
before the exec, if any. `sdk_driver.decide` judges the SDK's files: our launcher takes the job
over (`train`, with the SDK's entry script, hyperparameters, requirements and SM_* variables),
or the SDK's start runs as it is, as a child of ours, so that a stop still reaches it (PID 1
bash would drop it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from container_entry.common import stopping
from container_entry.common.logs import log
from container_entry.plan import sdk_driver
from container_entry.plan.environment import base_dir_from
from container_entry.supervise.outcome import Outcome

STOP_GRACE_DEFAULT = 100.0


def judged(shell_argv: Sequence[str], environ: Mapping[str, str]) -> sdk_driver.Decision:
    """The SDK's files as they are here, judged; reading never fails (what cannot be read is
    a layout this release does not know, or the plan's to report)."""
    from container_entry.plan.environment import read_json

    base = base_dir_from(environ)
    hyperparameters: dict = {}
    with contextlib.suppress(Exception):
        hyperparameters = read_json(base / "input" / "config" / "hyperparameters.json")
    return sdk_driver.decide(
        shell_argv,
        sdk_driver.read_files(base),
        base,
        opted_out=sdk_driver.opted_out(environ, hyperparameters),
    )


def _number(name: str | None) -> int:
    """A stop signal's number from its name (Stop keeps names)."""
    return int(getattr(signal, name or "SIGTERM", signal.SIGTERM))


def _grace(environ: Mapping[str, str]) -> float:
    """STOP_GRACE_PERIOD as the settings give it; the default where they cannot be read."""
    from container_entry.plan import settings

    with contextlib.suppress(Exception):
        return settings.resolve(environ, {}).stop_grace_period
    return STOP_GRACE_DEFAULT


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap(child: subprocess.Popen) -> None:
    """Collect our child's status, and, as PID 1, the orphans it left (its script's processes
    once the shell itself ended)."""
    child.poll()
    if os.getpid() == 1:
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass


def run_unchanged(shell_argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """The SDK's start exactly as it would have run, in a process group of its own; a stop is
    sent to that whole group (the shell and what it started), which then has the stop grace to
    exit before SIGKILL; exit 128+N. Otherwise the shell's own exit status."""
    stop = stopping.Stop()
    stop.raising = False  # never raised: every stop is the child's to answer
    stop.install()
    outcome = Outcome(base_dir_from(environ))
    if stop.signal is not None:
        log(f"stopped by {stop.signal} before the SDK's start ran")
        outcome.failure(f"StopRequested: stopped by {stop.signal} before the SDK's start ran")
        return 128 + _number(stop.signal)
    grace = _grace(environ)
    with stop.wakes_on_child_exit():
        child = subprocess.Popen(list(shell_argv), process_group=0, env=dict(environ))
        sent: float | None = None
        while True:
            _reap(child)
            if sent is None and child.returncode is not None:
                break
            if sent is None and stop.signal is not None:
                log(f"{stop.signal}: sent to the SDK's start (its processes have {grace:g} s)")
                with contextlib.suppress(OSError):
                    os.killpg(child.pid, _number(stop.signal))
                sent = time.monotonic()
            if sent is not None:
                if child.returncode is not None and not _group_alive(child.pid):
                    break
                if time.monotonic() - sent > grace:
                    log(f"the SDK's start still ran {grace:g} s after the stop: killed")
                    with contextlib.suppress(OSError):
                        os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
                    break
            stop.wait(0.5)
    stop.after_workers()
    if sent is not None:
        waited = time.monotonic() - sent
        what = f"job stopped by {stop.signal}: the SDK's start ended {waited:.1f} s after it"
        log(what)
        outcome.failure(f"StopRequested: {what}")
        return 128 + _number(stop.signal)
    code = child.returncode
    return 128 - code if code < 0 else code


def handed_over(args: Sequence[str], environ: Mapping[str, str]) -> sdk_driver.Decision:
    """`STOP SHELL -c STRING` from the hook: the stop its shell noted, if any, is noted here as
    if it had come now; the SDK's start is judged, and the verdict said in one line."""
    stopped = args[0] if args else ""
    if stopped in {s.name for s in stopping.STOP_SIGNALS}:
        stopping.note_early(_number(stopped))
    decision = judged(args[1:], environ)
    log(decision.why)
    return decision
