"""Pure resolution: Environment -> Plan. No I/O, no side effects; print it, test it, run it.

`build_plan` raises ConfigError for input that leaves nothing to plan (a malformed config file,
a bad setting); what it can plan around (no entry script, a script that is not there, an
unsupported torch, an environment too large to start a process with) goes into
`Plan.problems`, so `plan` can show everything else. `train` refuses a plan with problems.

`build_plan` puts together one decision per function: the code and the entry script
(code_source), torchrun's command line (torchrun.launch), the SM_* contract (contract), what
every script is given (`_bootstrap_env`), the workers' defaults (worker_defaults), the limits of
a process's start (`_oversized`) and the secrets to mask.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from container_entry.common.layout import RunDir
from container_entry.common.masking import MASK, Masker, argv_pairs, is_secret_name, secret_values
from container_entry.common.programs import PREFLIGHT_SCRIPT, UNBUFFERED
from container_entry.diagnose.hang import AUTO_FACTOR, AUTO_FLOOR, PROGRESS_ENV
from container_entry.plan import contract, gpus, hyperparameters, sdk_driver, settings, torchrun
from container_entry.plan.cluster import Topology, resolve_topology
from container_entry.plan.code_source import CodeSource, entry_program, locate_code
from container_entry.plan.environment import Environment
from container_entry.plan.sdk_driver import SdkJob
from container_entry.plan.settings import HYPERPARAMETER_PREFIX, Settings
from container_entry.plan.worker_defaults import Defaults, threads, worker_env

MAX_ARG_STRLEN = 131072  # Linux: the most bytes one argv or environment string may hold


def workers_of(nproc_per_node: str, gpus: int) -> int:
    """Workers per host from torchrun's value ("gpu"/"auto" from PET_* count the GPUs)."""
    return int(nproc_per_node) if nproc_per_node.isdigit() else max(1, gpus)


@dataclass(frozen=True)
class EnvVar:
    value: str
    reason: str


@dataclass(frozen=True)
class Plan:
    topology: Topology
    master_addr: str  # the topology's, unless PET_MASTER_ADDR says otherwise
    master_port: int
    coordinated: bool  # whether the bootstraps of all hosts relay failures to each other
    nproc_per_node: str  # what torchrun will use; a string because PET_ may say "gpu"/"auto"
    nproc_source: str
    backend: str
    num_gpus: int
    torch_version: str | None
    program: str | None  # None: no entry script named
    code: CodeSource
    user_args: tuple[str, ...]
    hyperparameters: dict[str, Any]
    argv: tuple[str, ...]  # torchrun's command line: its options and our worker module
    command: tuple[str, ...]  # what each worker runs: the script and its arguments
    env: dict[str, EnvVar]  # variables the bootstrap adds, each with its reason
    user_env_kept: tuple[str, ...]  # variables we would have set but the user already had
    settings: Settings
    max_restarts: int = 0  # what torchrun will use (PET_MAX_RESTARTS wins)
    preflight: tuple[str, ...] = ()  # what each rank runs before the script; empty: none
    problems: tuple[str, ...] = ()  # why this plan cannot run; empty: it can
    gpu_problem: bool = False  # one of them is this host's GPUs (exit 4, DeviceError)
    secrets: tuple[str, ...] = field(default=(), repr=False)  # values masked in all output
    warnings: tuple[str, ...] = ()  # what the user should know; the plan can still run
    cpu_count: int = 1  # this host's, for the thread default
    physical_cores: int | None = None
    boot_id: str | None = None  # this machine's kernel, told to the other hosts at the join
    sdk: SdkJob | None = None  # SageMaker SDK v3's start, taken over (sdk_driver)

    @property
    def workers(self) -> int:
        """Workers this host starts."""
        return workers_of(self.nproc_per_node, self.num_gpus)

    def sharing_machine(self, hosts: int, workers: int) -> Plan:
        """The same plan once the join showed `hosts` hosts of this job, `workers` workers in
        all, on this one machine: the thread default divides the machine's cores among all of
        them. Unchanged where the user set OMP_NUM_THREADS or the machine is not shared."""
        if hosts <= 1 or "OMP_NUM_THREADS" not in self.env:
            return self
        value, reason = threads(
            gpu_count=self.num_gpus,
            cpu_count=self.cpu_count,
            physical_cores=self.physical_cores,
            workers=workers,
            hosts_on_machine=hosts,
        )
        env = {**self.env, "OMP_NUM_THREADS": EnvVar(value, reason)}
        return dataclasses.replace(self, env=env)

    @property
    def coordination_port(self) -> int:
        """The bootstraps' own side channel on the master host."""
        return self.master_port + 1

    def masker(self) -> Masker:
        return Masker(self.secrets)

    def to_dict(self, *, masked: bool = True) -> dict[str, Any]:
        data = asdict(self)
        del data["secrets"]
        data["coordination_port"] = self.coordination_port
        data["env"] = {k: {"value": v.value, "reason": v.reason} for k, v in self.env.items()}
        if masked:  # by the same rule as everything else: a credential's name and value
            for name, item in data["env"].items():
                if is_secret_name(name) and secret_values([(name, item["value"])]):
                    item["value"] = MASK
            data = self.masker().obj(data)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    def summary(self) -> str:
        """The compact block printed at start."""
        topology = self.topology
        env_names = " ".join(sorted(k for k in self.env if not k.startswith("SM_")))
        sm_count = sum(1 for k in self.env if k.startswith("SM_"))
        lines = [
            f"mode        {topology.source}",
            f"hosts       {len(topology.hosts)}: {', '.join(topology.hosts)}",
            f"this host   {topology.current_host} (node rank {topology.node_rank})",
            f"master      {self.master_addr}:{self.master_port} "
            f"(coordination :{self.coordination_port})",
            f"workers     {self.nproc_per_node} per host ({self.nproc_source}), {self.backend}",
            f"torch       {self.torch_version or 'not installed'}; a stop reaches the ranks "
            f"from the bootstrap ({self.settings.stop_grace_period:g} s grace)",
            f"code        {self.command[0]} ({self.code.kind}: {self.code.location})",
            *([f"sdk         SageMaker SDK v3 {self.sdk.describe()}"] if self.sdk else []),
            f"arguments   {' '.join(self.command[1:]) or '-'}",
            f"env added   {sm_count} SM_* + {env_names or '-'}",
        ]
        timeout = self.settings.hang_timeout
        if timeout:
            lines.append(
                f"hang        declared after {timeout:g} s with no output "
                "from any rank (HANG_TIMEOUT; exit 124)"
            )
        elif timeout is None and len(topology.hosts) > 1:
            lines.append(
                f"hang        declared after max({AUTO_FLOOR / 60:g} min, {AUTO_FACTOR:g} x the "
                "longest silence the job came back from) with no output from any rank on any "
                "host, once every host printed (HANG_TIMEOUT=auto; 0: off; exit 124)"
            )
        if self.user_env_kept:
            lines.append(f"env kept    {' '.join(self.user_env_kept)} (already set: left as is)")
        lines += [f"warning     {text}" for text in self.warnings]
        return self.masker().text("\n".join(lines))


def _local_channels(env: Environment) -> list[str] | None:
    """Local mode's input channels: those the job was given and the folders found on disk (the
    DLC cannot run there to say otherwise). None under SageMaker: the DLC's, inputdataconfig's."""
    if env.resource_config is not None:
        return None
    return sorted(set(env.input_data_config) | set(env.local_channels))


def _size(text: str) -> int:
    """Bytes of `text` as the kernel gets it (an undecodable byte is one byte, as it came)."""
    return len(text.encode("utf-8", "surrogateescape"))


def _oversized(
    environ: Mapping[str, str], command: Sequence[str], arg_max: int, user: Mapping[str, Any]
) -> str | None:
    """Why the workers could not be started with this environment and command line (the
    kernel's E2BIG), naming the variable or argument; None when they can."""
    biggest = max(user, key=lambda k: len(str(user[k])), default=None)
    culprit = (
        f" (hyperparameter {biggest!r} is {_size(str(user[biggest])):,} bytes)"
        if biggest is not None and _size(str(user[biggest])) > MAX_ARG_STRLEN // 4
        else ""
    )
    for name, value in environ.items():
        size = len(name.encode()) + len(value.encode("utf-8", "surrogateescape")) + 2
        if size > MAX_ARG_STRLEN:
            return (
                f"environment variable {name} is {size:,} bytes, over the kernel's limit of "
                f"{MAX_ARG_STRLEN:,} for one variable{culprit if name.startswith('SM_') else ''}"
            )
    for arg in command:
        size = len(arg.encode("utf-8", "surrogateescape")) + 1
        if size > MAX_ARG_STRLEN:
            return (
                f"script argument {arg[:40]!r}... is {size:,} bytes, over the kernel's limit of "
                f"{MAX_ARG_STRLEN:,} for one argument{culprit}"
            )
    total = sum(len(k) + len(v) + 2 + 8 for k, v in environ.items())
    total += sum(len(a) + 1 + 8 for a in command) + 8192  # what torchrun and Python add
    if total > arg_max:
        return (
            f"the workers' environment and arguments total {total:,} bytes, over the kernel's "
            f"limit of {arg_max:,}{culprit}"
        )
    return None


def _torch_problems(env: Environment, launcher: torchrun.Torchrun) -> list[str]:
    """Why the installed torch cannot launch the job, if it cannot."""
    if env.torch_version is None:
        return [f"torch is not installed for {env.python}: torchrun cannot start"]
    if not launcher.supported:
        return [
            f"torch {env.torch_version} is older than the oldest supported release "
            f"({'.'.join(map(str, torchrun.OLDEST))})"
        ]
    return []


def _sm_env(
    env: Environment,
    topology: Topology,
    hps: hyperparameters.Hyperparameters,
    user_args: list[str],
    program: str | None,
) -> dict[str, EnvVar]:
    """The SM_* variables, as sagemaker-training exports them (contract.py; the deliberate
    differences: docs/sm-contract.md)."""
    sm = contract.sm_env(
        base_dir=env.environ.get("SAGEMAKER_BASE_DIR") or str(env.base_dir),
        resource_config=env.resource_config
        if env.resource_config is not None
        else contract.local_resource_config(topology.hosts, topology.current_host),
        input_data_config=env.input_data_config,
        hyperparameters=hps,
        user_args=user_args,
        environ=env.environ,
        machine=contract.Machine(
            gpus=env.listed_gpus,
            cpus=env.all_cpus,
            neurons=env.neuron_cores,
            smddprun=env.smddprun,
            smddpmprun=env.smddpmprun,
        ),
        channels=_local_channels(env),
        # a script named on our command line, or SDK v3's, stands where SAGEMAKER_PROGRAM would
        named_program=posixpath.basename(program)
        if program and (env.cli_args or env.sdk)
        else None,
        # our world's rank-0 host where our launcher forms a world the DLC would not; not
        # passed yet, so the DLC's own master is exported
        world_master=None,
    )
    reason = "SageMaker contract (as sagemaker-training exports it)"
    found = {name: EnvVar(value, reason) for name, value in sm.items()}
    sdk = "SageMaker SDK v3 contract (its scripts/environment.py)"
    return {**found, **{name: EnvVar(value, sdk) for name, value in env.sdk_env.items()}}


def _bootstrap_env(
    env: Environment, topology: Topology, knobs: Settings, code: CodeSource, job_name: object
) -> dict[str, EnvVar]:
    """What every script is given beside the SM_* contract and the workers' defaults."""
    wanted: dict[str, EnvVar] = {}
    if job_name:
        wanted["SAGEMAKER_JOB_NAME"] = EnvVar(str(job_name), "transformers detects SageMaker")
    wanted["CURRENT_HOST"] = EnvVar(topology.current_host, "SageMaker contract")
    wanted["SM_CHECKPOINT_DIR"] = EnvVar(
        str(env.base_dir / "checkpoints"), "where SageMaker syncs checkpoints with S3 (resume)"
    )
    wanted[UNBUFFERED[0]] = EnvVar(UNBUFFERED[1], "live logs: print reaches stdout at once")
    wanted["PYTHONPATH"] = EnvVar(code.code_dir, "user modules importable, as the incumbent")
    wanted[PROGRESS_ENV] = EnvVar(
        str(RunDir.of(env.base_dir).progress),
        "touch it (or call container_entry.hang.report_progress()) to count as output for "
        + (f"HANG_TIMEOUT ({knobs.hang_timeout:g} s)" if knobs.hang_timeout else "HANG_TIMEOUT"),
    )
    return wanted


def _defaults(env: Environment, topology: Topology, gpu: gpus.GpuCount, nproc: str) -> Defaults:
    """The workers' defaults for this host (worker_defaults)."""
    return worker_env(
        topology=topology,
        gpu_count=gpu.count,
        efa_devices=env.efa_devices,
        interfaces=env.interfaces,
        cpu_count=env.cpu_count,
        workers_per_host=workers_of(nproc, gpu.count),
        run_dir=RunDir.of(env.base_dir),
        environ=env.environ,
        torch_version=env.torch_version,
        physical_cores=env.physical_cores,
        nccl_conf=env.nccl_conf,
        ofi_nccl_version=env.ofi_nccl_version,
        libfabric_version=env.libfabric_version,
        kernel_release=env.kernel_release,
        shm_bytes=env.shm_bytes,
    )


def _secrets(env: Environment, user_args: Sequence[str]) -> tuple[str, ...]:
    """Every value masked in the job's output: credentials in the environment, the
    hyperparameters and the script's command line."""
    pairs = [*env.environ.items(), *env.hyperparameters.items(), *argv_pairs(user_args)]
    return tuple(secret_values(pairs))


def build_plan(env: Environment) -> Plan:
    """Decide everything about the launch; raises ConfigError naming the bad file or value."""
    topology = resolve_topology(env)
    hps = hyperparameters.split(env.hyperparameters)
    knobs = settings.resolve(env.environ, hps.settings)
    gpu = gpus.count_gpus(env.environ, env.nvidia_smi, env.nvidia_smi_error, env.gpu_driver)
    program = entry_program(env, hps.sagemaker)
    user_args = (
        list(env.cli_args[1:])
        if env.cli_args
        else sdk_driver.script_args(env.hyperparameters, HYPERPARAMETER_PREFIX)
        if env.sdk
        else hyperparameters.to_args(hps.user)
    )
    job_name = env.environ.get("TRAINING_JOB_NAME") or hps.sagemaker.get("sagemaker_job_name")
    code, script, code_problems = locate_code(env, program, hps.sagemaker)
    launcher = torchrun.Torchrun(env.torch_version or "0.0")
    problems = [*gpu.problems, *code_problems, *_torch_problems(env, launcher)]
    asked = env.sdk.processes_per_host if env.sdk else None
    launch = torchrun.launch(
        launcher, env.environ, env.python, topology, knobs, gpu, job_name, processes=asked
    )
    defaults = _defaults(env, topology, gpu, launch.nproc)
    wanted = {
        **_sm_env(env, topology, hps, user_args, program),
        **_bootstrap_env(env, topology, knobs, code, job_name),
        **{name: EnvVar(value, reason) for name, (value, reason) in defaults.env.items()},
    }
    if launch.restarts:
        wanted["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = EnvVar(
            "1", "restarts: every attempt gets a fresh store (no stale peer addresses)"
        )
    added = {k: v for k, v in wanted.items() if k not in env.environ}
    kept = {k for k in wanted if k in env.environ} | {*launch.pet_kept, *defaults.user_aliases}
    command = (script, *user_args)
    child_env = {**env.environ, **{k: v.value for k, v in added.items()}}
    oversized = _oversized(child_env, command, env.arg_max, hps.user)
    preflight = knobs.preflight == "true" or (knobs.preflight == "auto" and len(topology.hosts) > 1)
    return Plan(
        topology=topology,
        master_addr=launch.master_addr,
        master_port=launch.master_port,
        coordinated=topology.coordinated and len(topology.hosts) > 1,
        nproc_per_node=launch.nproc,
        nproc_source=launch.nproc_source,
        backend="nccl" if gpu.count else "gloo",
        num_gpus=gpu.count,
        torch_version=env.torch_version,
        program=program,
        code=code,
        user_args=tuple(user_args),
        hyperparameters=hps.user,
        argv=launch.argv,
        command=command,
        env=added,
        user_env_kept=tuple(sorted(kept)),
        settings=knobs,
        max_restarts=launch.restarts,
        preflight=(PREFLIGHT_SCRIPT,) if preflight else (),
        problems=(*problems, *([oversized] if oversized else [])),
        gpu_problem=bool(gpu.problems),
        secrets=_secrets(env, user_args),
        warnings=(*gpu.warnings, *defaults.warnings),
        cpu_count=env.cpu_count,
        physical_cores=env.physical_cores,
        boot_id=env.boot_id,
        sdk=env.sdk,
    )
