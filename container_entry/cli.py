"""Commands: `train` (launch), `plan` (dry run, JSON), anything else runs as given.

`container-entry` is the image's ENTRYPOINT: no arguments or `train` starts training (what
SageMaker and SDK v3 local mode run), `plan` prints the plan, any other command (`bash`,
`python -c ...`) is exec'd unchanged, as the DLC's entrypoint does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from container_entry import code, network
from container_entry.coordination import Coordinator, Member
from container_entry.environment import base_dir_from, read_environment
from container_entry.errors import BootstrapError, NetworkError
from container_entry.failure import Outcome, verdict
from container_entry.launch import Run, Supervisor
from container_entry.logs import log, register_secrets
from container_entry.plan import Plan, build_plan

USAGE = """usage: container-entry [train [SCRIPT [ARGS...]] | plan [SCRIPT [ARGS...]] | COMMAND...]

  train   resolve the plan, fetch code, launch one DDP worker per GPU via torchrun (default)
  plan    print the launch plan as JSON and exit, launching nothing
  COMMAND anything else runs unchanged (bash, python -c ..., ...)
"""


def _resolve(cli_args: Sequence[str]) -> Plan:
    env = read_environment(cli_args=cli_args)
    register_secrets(env.environ, env.hyperparameters.items())
    return build_plan(env)


def plan_command(cli_args: Sequence[str]) -> int:
    try:
        plan = _resolve(cli_args)
    except BootstrapError as error:
        log(f"error: {error}")
        return error.exit_code
    print(plan.to_json(), flush=True)
    return 0


def _check_port_free(port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # SO_REUSEADDR as torch's TCPStore: only a live listener counts as "in use"
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as error:
            raise NetworkError(
                f"{what} port {port} is in use on this host ({error.strerror}): "
                "set CONTAINER_ENTRY_MASTER_PORT to a free port"
            ) from None


class StopRequested(BootstrapError):
    """SIGTERM/SIGINT before the workers started: exit as a stopped job."""

    exit_code = 143


def _stop_before_launch(signum: int, _frame: object) -> None:
    # As PID 1 in a container a signal without a handler is ignored: without this, a stop
    # during the host wait or the join would only end at SageMaker's SIGKILL.
    raise StopRequested(f"stopped by {signal.Signals(signum).name} before the workers started")


def _late_stop(signum: int, _frame: object) -> None:
    # the workers are done and the outcome is written: a stop now changes nothing
    log(f"received {signal.Signals(signum).name} after the workers finished: finishing up")


class Job:
    """One host's part of the job: join the others, prepare, launch, report."""

    def __init__(self, plan: Plan, environ: dict[str, str], base: Path) -> None:
        self.plan = plan
        self.environ = environ
        self.base = base
        self.run_dir = base / "output" / "data" / "container-entry"
        self.coordinator: Coordinator | None = None
        self.member: Member | None = None

    def join(self) -> None:
        """Multi-host: every host resolves, joins the side channel, before anything else."""
        plan = self.plan
        if plan.wait_for:
            network.wait_for_hosts(plan.wait_for, float(plan.settings["host_wait_timeout"]))
        if not plan.coordinated:
            return
        if plan.node_rank == 0:
            _check_port_free(plan.master_port, "master")
            self.coordinator = Coordinator(plan.hosts, plan.coordination_port)
        self.member = Member(plan.current_host, plan.master_addr, plan.coordination_port)
        timeout = float(plan.settings["join_timeout"])
        try:
            self.member.join(timeout)
        except NetworkError:
            if self.coordinator and self.coordinator.missing():
                raise NetworkError(
                    f"host(s) {', '.join(self.coordinator.missing())} never joined the job "
                    f"within {timeout:g} s"
                ) from None
            raise

    def prepare(self) -> None:
        if self.plan.node_rank == 0 and not self.plan.coordinated:  # else checked in join()
            _check_port_free(self.plan.master_port, "master")
        code.prepare(self.plan, self.environ)
        code.install_requirements(self.plan, self.plan.argv[0])
        for directory in (self.base / "model", self.run_dir):
            directory.mkdir(parents=True, exist_ok=True)

    def preflight(self) -> Run | None:
        """The cluster check, launched like the job itself; None when it is off."""
        if not self.plan.preflight_argv:
            return None
        log("preflight: checking GPUs, matmul and all_reduce on every host")
        checked = dataclasses.replace(self.plan, argv=self.plan.preflight_argv, max_restarts=0)
        supervisor = Supervisor(checked, self.environ, self.run_dir / "preflight", self.member)
        supervisor.monitor(supervisor.launch())
        return supervisor.run

    def run(self) -> Run:
        supervisor = Supervisor(self.plan, self.environ, self.run_dir, self.member)
        if self.member and self.member.aborted.is_set():  # a peer failed while we prepared
            supervisor.run.remote_failure = self.member.abort or {}
            return supervisor.run
        process = supervisor.launch()
        supervisor.monitor(process)
        return supervisor.run

    def post_failure(self, reason: str) -> None:
        if self.member:
            self.member.post_failure(
                {
                    "host": self.plan.current_host,
                    "rank": None,
                    "returncode": 2,
                    "exception": {"type": "BootstrapError", "message": reason},
                }
            )

    def finish(self, success: bool) -> None:
        if self.member:
            if success:
                self.member.done()
            self.member.close()
        if self.coordinator:
            self.coordinator.wait_finished(60.0 if success else 5.0)
            self.coordinator.close()


def train(cli_args: Sequence[str]) -> int:
    """Resolve, join, prepare, launch; every outcome leaves a success or failure file."""
    environ = dict(os.environ)
    base = base_dir_from(environ)
    outcome = Outcome(base)
    job: Job | None = None
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop_before_launch)
    try:
        plan = _resolve(cli_args)
        if plan.settings["dry_run"]:
            print(plan.to_json(), flush=True)
            return 0
        log("plan\n" + plan.summary())
        job = Job(plan, environ, base)
        job.join()
        job.prepare()
    except BootstrapError as error:
        log(f"error: {error}")
        outcome.failure(f"{type(error).__name__}: {error}")
        if job:
            job.post_failure(str(error))
            job.finish(success=False)
        return error.exit_code
    except OSError as error:
        log(f"error: {error}")
        outcome.failure(f"OSError: {error}")
        return 2
    try:
        checked = job.preflight()
        if checked is not None:
            result = verdict(checked, plan.current_host, job.run_dir / "preflight")
            if result.exit_code != 0:
                reason = f"preflight failed, the script did not start: {result.reason}"
                log(f"failed: {reason}")
                outcome.failure(reason, result.details)
                return result.exit_code
        run = job.run()
        result = verdict(run, plan.current_host, job.run_dir)
        if result.exit_code == 0:
            log("training finished: all workers exited 0")
            outcome.success()
        else:
            log(f"failed: {result.reason}")
            outcome.failure(
                result.reason, result.details, {"reason": result.reason, "ranks": run.results}
            )
        return result.exit_code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, _late_stop)
        job.finish(success=locals().get("result") is not None and result.exit_code == 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] == "train":
        return train(args[1:])
    if args[0] == "plan":
        return plan_command(args[1:])
    if args[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return 0
    with contextlib.suppress(OSError):
        os.execvp(args[0], args)
    log(f"error: cannot run {args[0]!r}: command not found or not executable")
    return 127


def train_main() -> int:
    """The `train` console script: what SageMaker runs."""
    return train(sys.argv[1:])
