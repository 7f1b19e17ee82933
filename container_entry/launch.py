"""Spawn torchrun, supervise it, tear it down on failure or stop: the launcher's phases.

launch -> monitor -> teardown -> verdict. The monitor watches four things: torchrun's exit, the
per-rank result records the worker wrappers write, aborts relayed from other hosts, and stop
signals. Whatever ends the job, every worker process group is gone when this returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container_entry.coordination import Member
from container_entry.logs import log
from container_entry.plan import Plan
from container_entry.preflight import EXPECTED_GPUS_ENV
from container_entry.worker import CONSOLE_ENV, RUN_DIR_ENV

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
POLL_SECONDS = 0.1


@dataclass
class Run:
    """What the monitor saw; failure.verdict turns it into an exit code and a failure text."""

    returncode: int | None = None  # torchrun's
    results: dict[int, dict[str, Any]] = field(default_factory=dict)
    first_failure: dict[str, Any] | None = None  # a local rank that failed on its own
    remote_failure: dict[str, Any] | None = None  # relayed from another host
    stop_signal: str | None = None
    stop_at: float | None = None
    torchrun_tail: list[str] = field(default_factory=list)
    forced_kill: bool = False


def child_environment(plan: Plan, environ: Mapping[str, str], run_dir: Path) -> dict[str, str]:
    """The user's environment plus the plan's additions (which never overwrite user values)."""
    env = dict(environ)
    for name, var in plan.env.items():
        env.setdefault(name, var.value)
    env[RUN_DIR_ENV] = str(run_dir)
    env[CONSOLE_ENV] = str(plan.settings.get("console_ranks", "all"))
    env[EXPECTED_GPUS_ENV] = str(plan.num_gpus)  # read by the preflight only
    return env


def prepare_run_dir(run_dir: Path) -> None:
    """Our own records only: remove a previous run's rank files in this tree, nothing else."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    for pattern in ("rank-*.json", "rank-*.pid", "rank-*.tmp", "logs/rank-*.log"):
        for stale in run_dir.glob(pattern):
            stale.unlink(missing_ok=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _worker_groups(run_dir: Path) -> list[int]:
    groups = []
    for path in run_dir.glob("rank-*.pid"):
        record = _read_json(path)
        if record:
            groups.append(int(record["wrapper"]))
    return groups


def kill_workers(run_dir: Path, sig: signal.Signals) -> None:
    """Signal every worker's process group (wrapper and script share one)."""
    for group in _worker_groups(run_dir):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


def capture_stacks(run_dir: Path, wait: float = 0.5) -> None:
    """Ask every live rank to write all its threads' Python stacks (faulthandler on SIGUSR2,
    registered by _site/sitecustomize.py) before it is torn down."""
    asked = False
    for path in run_dir.glob("rank-*.pid"):
        record = _read_json(path)
        if record:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(record["child"]), signal.SIGUSR2)
                asked = True
    if asked:
        time.sleep(wait)


def _pump_stderr(process: subprocess.Popen, tail: deque[str]) -> None:
    """torchrun's stderr (its own lines and the workers') goes on to ours at once; the lines
    that are torchrun's own are kept for the failure report."""
    assert process.stderr is not None
    for raw in iter(process.stderr.readline, b""):
        line = raw.decode("utf-8", errors="replace")
        os.write(2, raw)
        if not line.startswith("["):
            tail.append(line.rstrip("\n"))


class Supervisor:
    def __init__(
        self, plan: Plan, environ: Mapping[str, str], run_dir: Path, member: Member | None
    ) -> None:
        self.plan = plan
        self.environ = environ
        self.run_dir = run_dir
        self.member = member
        self.run = Run()
        self.stop_event = threading.Event()
        self.failure_grace = float(plan.settings["failure_grace_period"])
        self.stop_grace = float(plan.settings["stop_grace_period"])
        self.previous: dict[signal.Signals, Any] = {}
        # with restarts torchrun retries a failed group itself: only its final exit is a failure
        self.restarts = plan.max_restarts

    # -- launch ---------------------------------------------------------------------------
    def launch(self) -> subprocess.Popen:
        """Our stop handler goes in first, so no signal falls between spawn and monitor."""
        prepare_run_dir(self.run_dir)
        self.previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        return subprocess.Popen(
            list(self.plan.argv),
            env=child_environment(self.plan, self.environ, self.run_dir),
            cwd=self.plan.code.code_dir,
            stderr=subprocess.PIPE,
        )

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.run.stop_signal is None:
            self.run.stop_signal = signal.Signals(signum).name
            self.run.stop_at = time.time()
        self.stop_event.set()

    # -- monitor --------------------------------------------------------------------------
    def _collect(self, final: bool = False) -> None:
        for path in self.run_dir.glob("rank-*.json"):
            record = _read_json(path)
            if record and record.get("rank") is not None:
                self.run.results[int(record["rank"])] = record
        if self.run.first_failure or self.run.remote_failure or self.run.stop_signal:
            return
        failed = [
            r for r in self.run.results.values() if r.get("returncode") and not r.get("stop_signal")
        ]
        if failed and (self.restarts == 0 or final):
            self.run.first_failure = min(failed, key=lambda r: r.get("ended_at", 0))

    def monitor(self, process: subprocess.Popen) -> None:
        tail: deque[str] = deque(maxlen=30)
        pump = threading.Thread(target=_pump_stderr, args=(process, tail), daemon=True)
        pump.start()
        deadline: float | None = None
        try:
            while process.poll() is None:
                self._collect()
                now = time.monotonic()
                if deadline is None:
                    deadline = self._decide_teardown(process, now)
                elif now >= deadline:
                    log("grace period over: recording stacks, killing the remaining workers")
                    capture_stacks(self.run_dir)
                    self.run.forced_kill = True
                    kill_workers(self.run_dir, signal.SIGKILL)
                    process.kill()
                    break
                self.stop_event.wait(POLL_SECONDS)
                self.stop_event.clear()  # a handled stop must not turn this into a busy loop
            process.wait()
        finally:
            for sig, handler in self.previous.items():
                signal.signal(sig, handler)
            kill_workers(self.run_dir, signal.SIGKILL)  # nothing outlives the launcher
            pump.join(timeout=2)
            _reap_orphans()
        self._collect(final=True)
        self.run.returncode = process.returncode
        self.run.torchrun_tail = list(tail)

    def _decide_teardown(self, process: subprocess.Popen, now: float) -> float | None:
        """Start a teardown when needed; returns its deadline."""
        if self.run.stop_signal:
            # torchrun signals each worker's process group once, at once, then waits its
            # --shutdown-timeout (our stop grace period) before SIGKILL: exactly one signal each
            log(
                f"received {self.run.stop_signal}: stopping every rank "
                f"(grace period {self.stop_grace:g} s)"
            )
            process.send_signal(signal.Signals[self.run.stop_signal])
            return now + self.stop_grace + 5
        if self.run.first_failure:
            failure = self.run.first_failure
            log(
                f"rank {failure['rank']} on {failure['host']} failed: stopping this host's "
                "workers and telling the other hosts"
            )
            if self.member:
                self.member.post_failure(
                    {
                        k: failure.get(k)
                        for k in (
                            "host",
                            "rank",
                            "local_rank",
                            "returncode",
                            "signal",
                            "exception",
                            "fatal_error",
                            "ended_at",
                        )
                    }
                )
            capture_stacks(self.run_dir)
            process.send_signal(signal.SIGTERM)
            return now + self.failure_grace
        if self.member and self.member.aborted.is_set():
            self.run.remote_failure = self.member.abort or {}
            log("another host failed: recording stacks, stopping this host's workers")
            capture_stacks(self.run_dir)
            process.send_signal(signal.SIGTERM)
            return now + self.failure_grace
        return None


def _reap_orphans() -> None:
    """As PID 1 we inherit orphaned processes' zombies; collect them."""
    if os.getpid() != 1:
        return
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
