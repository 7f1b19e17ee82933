"""One host's part of a training job: resolve, join the others, prepare, preflight, launch,
report. Every outcome leaves `<base>/output/success` or `<base>/output/failure` and an exit
code with a meaning (docs/failure-stop-logs.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from container_entry.common import offspring
from container_entry.common.errors import (
    BootstrapError,
    CodeError,
    ConfigError,
    DeviceError,
    StopRequested,
)
from container_entry.common.exits import ExitCode
from container_entry.common.layout import RunDir
from container_entry.common.logs import log, register_secrets
from container_entry.common.stopping import Stop
from container_entry.diagnose.failure import error_words
from container_entry.hosts import PeerFailure, network
from container_entry.hosts.session import Session, session_key
from container_entry.plan.code_source import CodeKind
from container_entry.plan.environment import (
    Environment,
    base_dir_from,
    read_code_files,
    read_environment,
)
from container_entry.plan.launch_mode import LaunchMode
from container_entry.plan.plan import Plan, build_plan
from container_entry.plan.sdk_driver import SdkJob
from container_entry.rank.torch_gpus import check_visible_gpus
from container_entry.supervise import user_code
from container_entry.supervise.ending import Ending, EndingKind, Observed, Verdict
from container_entry.supervise.outcome import Outcome
from container_entry.supervise.prestart import Prestarted
from container_entry.supervise.supervisor import Supervisor
from container_entry.supervise.unchanged import run_unchanged


def toolkit_command(python: str) -> list[str]:
    """The base image's own start (sagemaker-training's `train` console script, which ours
    replaces in the image), run by the base's own Python."""
    return [python, "-m", "sagemaker_training.cli.train"]


def resolve(cli_args: Sequence[str], environ: Mapping[str, str] | None = None) -> Plan:
    """Environment -> plan, with every secret the plan found registered for masking."""
    return _resolve(cli_args, environ)[0]


def _resolve(
    cli_args: Sequence[str], environ: Mapping[str, str] | None, sdk: SdkJob | None = None
) -> tuple[Plan, Environment]:
    """The plan, and the Environment it was built from; where the code is already here (not
    fetched later), with its scripts read for the launch mode."""
    env = read_environment(environ, cli_args=cli_args, sdk=sdk)
    plan = build_plan(env)
    if plan.launch.pending and plan.code.kind in (CodeKind.DIRECTORY, CodeKind.CLI):
        env = replace(env, code_files=read_code_files(plan.code.code_dir, plan.command[0]))
        plan = build_plan(env)
    register_secrets(plan.secrets)
    return plan, env


class Job:
    """Join the others, prepare, launch, report."""

    def __init__(
        self,
        plan: Plan,
        environ: Mapping[str, str],
        base: Path,
        stop: Stop,
        *,
        key: bytes = b"",
        torchrun: Prestarted,
        env: Environment | None = None,
    ) -> None:
        self.plan = plan
        self.env = env  # what the plan was built from: built again once the code is here
        self.environ = environ
        self.base = base
        self.stop = stop
        self.session = Session(plan, key)  # the side channel (key: hosts.session.session_key)
        self.run_dir = RunDir.of(base)
        self.torchrun = torchrun  # started by the cli before the plan existed
        self.succeeded = False

    def prepare(self) -> None:
        plan = self.plan
        if plan.hosts_store and self.session.coordinator is None:  # else checked in join()
            network.check_port_free(plan.master_port, "master")
        user_code.prepare(plan, dict(self.environ))
        plan = self.plan = self.settle_launch(plan)
        user_code.install_requirements(plan, plan.argv[0])
        for directory in (self.base / "model", self.run_dir.path):
            directory.mkdir(parents=True, exist_ok=True)
        # before 8 ranks each fail alone: does torch see what was counted? (The preflight, when
        # it runs, checks the same on every host: no second Python start for it here.)
        if plan.num_gpus and not plan.preflight:
            env = {**{k: v.value for k, v in plan.env.items()}, **self.environ}
            problem = check_visible_gpus(plan.argv[0], plan.num_gpus, env)
            if problem:
                raise DeviceError(f"{plan.topology.current_host}: {problem}")

    def settle_launch(self, plan: Plan) -> Plan:
        """Code that came with the job (S3, an archive) is judged once it is here: our workers,
        or the entry point once per host if it launches its own (launch_mode)."""
        if not plan.launch.pending or self.env is None:
            return plan
        files = read_code_files(plan.code.code_dir, plan.command[0])
        settled = self.session.shared(build_plan(replace(self.env, code_files=files)))
        log(f"launch: {settled.launch.describe()}")
        return settled

    def announce_preflight(self) -> None:
        plan = self.plan
        if not plan.preflight:
            return
        hosts = plan.topology.nnodes
        checks = (
            f"{plan.num_gpus} GPUs (count, matmul against the CPU)"
            if plan.num_gpus
            else "no GPU on this host"
        )
        log(f"preflight: {checks}; all_reduce across {hosts} host{'s' * (hosts > 1)}")

    def execute(self, outcome: Outcome) -> int:
        self.plan = self.session.join()
        self.prepare()
        self.announce_preflight()
        supervisor = Supervisor(
            self.plan, self.environ, self.run_dir, self.session, self.stop, self.torchrun
        )
        ending, result = supervisor.run()
        return self.report(outcome, ending, result, supervisor.observed)

    def report(self, outcome: Outcome, ending: Ending, result: Verdict, run: Observed) -> int:
        """The verdict in the outcome files, and to the other hosts when it is a failure."""
        if result.exit_code == ExitCode.SUCCESS:
            log("training finished: all workers exited 0")
            self.succeeded = True
            return outcome.write(result)
        log(f"failed: {result.reason}")
        told = self.stop.came if ending.kind is EndingKind.STOPPED else None  # with its moment
        self.session.post(self.session.host_failure(result.reason, result.exit_code, told))
        ranks = {str(rank): record.to_json() for rank, record in sorted(run.results.items())}
        return outcome.write(result, {"reason": result.reason, "ranks": ranks})

    def finish(self) -> None:
        self.torchrun.discard()  # never launched: the job ended before (a failure, a stop)
        self.session.close(self.succeeded)


def train(
    cli_args: Sequence[str],
    stop: Stop,
    torchrun: Prestarted,
    sdk: SdkJob | None = None,
) -> int:
    """Resolve, join, prepare, launch; every outcome leaves a success or failure file. `sdk`:
    SageMaker SDK v3's start, taken over (sdk_start); `torchrun`: its interpreter, already
    started (the caller discards it if no launch took it)."""
    environ = dict(os.environ)
    outcome = Outcome(base_dir_from(environ))
    job: Job | None = None
    try:
        plan, env = _resolve(cli_args, environ, sdk)
        if plan.settings.dry_run:
            print(plan.to_json(), flush=True)
            return ExitCode.BAD_INPUT if plan.problems else ExitCode.SUCCESS
        if plan.launch.mode is LaunchMode.TOOLKIT:
            log(f"launch: {plan.launch.describe()}")
            grace = plan.settings.stop_grace_period
            what = "the base image's SageMaker toolkit"
            return run_unchanged(toolkit_command(env.python), environ, stop, outcome, grace, what)
        if plan.problems:
            error_type = (
                DeviceError if plan.gpu_problem else CodeError if plan.program else ConfigError
            )
            raise error_type("; ".join(plan.problems))
        key = session_key(env) if plan.coordinated else b""  # a short secret: exit 2
        log("plan\n" + plan.summary())
        base = base_dir_from(environ)
        job = Job(plan, environ, base, stop, key=key, torchrun=torchrun, env=env)
        return job.execute(outcome)
    except (BootstrapError, OSError) as error:
        if stop.cut_start and not isinstance(error, StopRequested):
            error = stop.requested()  # the stop's own exception, as the code it cut reshaped it
        stop.reporting()
        code = error.exit_code if isinstance(error, BootstrapError) else ExitCode.BAD_INPUT
        what = error_words(error, relayed=isinstance(error, PeerFailure))
        log(f"error: {error}")
        if job:
            job.session.post(job.session.host_failure(what, code))
        return outcome.write(Verdict(code, what, []))
    except BaseException:
        stop.reporting()
        if job:
            what = "internal error of container-entry"
            job.session.post(job.session.host_failure(what, ExitCode.INTERNAL))
        raise
    finally:
        stop.after_workers()
        if job:
            job.finish()
        offspring.end_all()  # a child whose Popen a stop cut off is ended too
