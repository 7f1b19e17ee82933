"""Pure resolution: Environment -> Plan. No I/O, no side effects; print it, test it, run it.

`build_plan` raises ConfigError for input that leaves nothing to plan (a malformed config file,
a bad setting); what it can plan around (no entry script, a script that is not there, an
unsupported torch, an environment too large to start a process with) goes into
`Plan.problems`, so `plan` can show everything else. `train` refuses a plan with problems.

`build_plan` puts together one decision per function: the code and the entry script
(code_source), torchrun's command line (torchrun.launch), the SM_* contract (contract), what
every script is given (`_bootstrap_env`), the workers' defaults (worker_defaults), the limits of
a process's start (`limits`) and the secrets to mask.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from container_entry.common.errors import ConfigError
from container_entry.common.layout import RunDir
from container_entry.common.masking import MASK, Masker, argv_pairs, is_secret_name, secret_values
from container_entry.common.programs import PREFLIGHT_SCRIPT
from container_entry.diagnose.hang import AUTO_FACTOR, AUTO_FLOOR
from container_entry.plan import (
    gpus,
    hyperparameters,
    launch_mode,
    limits,
    script_env,
    sdk_driver,
    settings,
    torchrun,
)
from container_entry.plan.cluster import Topology, resolve_topology
from container_entry.plan.code_source import CodeSource, entry_program, locate_code
from container_entry.plan.environment import Environment, code_key
from container_entry.plan.launch_mode import LaunchDecision, LaunchMode
from container_entry.plan.script_env import EnvVar
from container_entry.plan.sdk_driver import SdkJob
from container_entry.plan.settings import HYPERPARAMETER_PREFIX, Settings
from container_entry.plan.worker_defaults import Defaults, threads, worker_env


def workers_of(nproc_per_node: str, gpus: int) -> int:
    """Workers per host from torchrun's value ("gpu"/"auto" from PET_* count the GPUs)."""
    return int(nproc_per_node) if nproc_per_node.isdigit() else max(1, gpus)


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
    # our DDP workers, the entry point once on this host, or the base's toolkit (launch_mode)
    launch: LaunchDecision = launch_mode.DDP_BY_DEFAULT

    @property
    def once(self) -> bool:
        """The entry point runs once on this host (our one slot hosts it), as the DLC runs it."""
        return self.launch.mode is LaunchMode.ONCE

    @property
    def hosts_store(self) -> bool:
        """This host's torchrun serves its world's rendezvous store on `master_port`."""
        return self.launch.mode is LaunchMode.DDP and self.topology.node_rank == 0

    @property
    def dials_store(self) -> bool:
        """This host's torchrun reaches its world's store on another host (`master_addr`)."""
        return self.launch.mode is LaunchMode.DDP and self.topology.node_rank > 0

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
    def coordination_addr(self) -> str:
        """Where the side channel is dialled: this host's world's master when it serves it
        (as the torchrun flags name it), else the coordinator's own name."""
        topology = self.topology
        return (
            self.master_addr
            if topology.coordinator == topology.master_addr
            else topology.coordinator
        )

    @property
    def coordination_port(self) -> int:
        """The bootstraps' own side channel on the master host."""
        return self.master_port + 1

    def masker(self) -> Masker:
        return Masker(self.secrets)

    def _place(self) -> str:
        """Where this host stands: its node rank in its world, or none."""
        world = self.topology.world
        if not world or self.once:
            return "runs the entry point once, in no world of ours"
        if len(world) == len(self.topology.hosts):
            return f"node rank {self.topology.node_rank}"
        return f"node rank {self.topology.node_rank} of the world {', '.join(world)}"

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
        worlds = topology.worlds
        lines = [
            f"mode        {topology.source}",
            f"hosts       {len(topology.hosts)}: {', '.join(topology.hosts)}",
            *([f"worlds      {worlds.why}"] if worlds and len(topology.hosts) > 1 else []),
            f"this host   {topology.current_host} ({self._place()})",
            f"master      {self.master_addr}:{self.master_port} "
            f"(coordination {topology.coordinator}:{self.coordination_port})",
            f"launch      {self.launch.describe()}",
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
    decision = _launch_decision(env, topology, knobs, hps, code, script)
    launch = _launch(env, topology, knobs, hps, gpu, job_name, launcher, decision)
    defaults = _defaults(env, topology, gpu, launch.nproc)
    wanted = {
        **script_env.sm_variables(
            env, topology, hps, user_args, program, script_env.world_master(decision, topology)
        ),
        **script_env.bootstrap_variables(env, topology, knobs, code, job_name),
        **(
            script_env.once_variables(env, topology, hps)
            if decision.mode is LaunchMode.ONCE
            else {name: EnvVar(value, reason) for name, (value, reason) in defaults.env.items()}
        ),
    }
    if launch.restarts:
        wanted["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = EnvVar(
            "1", "restarts: every attempt gets a fresh store (no stale peer addresses)"
        )
    added = {k: v for k, v in wanted.items() if k not in env.environ}
    kept = {k for k in wanted if k in env.environ} | {*launch.pet_kept, *defaults.user_aliases}
    command = (script, *user_args)
    child_env = {**env.environ, **{k: v.value for k, v in added.items()}}
    oversized = limits.oversized(child_env, command, env.arg_max, hps.user)
    preflight = decision.mode is LaunchMode.DDP and (
        knobs.preflight == "true" or (knobs.preflight == "auto" and topology.nnodes > 1)
    )
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
        launch=decision,
    )


def _launch(
    env: Environment,
    topology: Topology,
    knobs: Settings,
    hps: hyperparameters.Hyperparameters,
    gpu: gpus.GpuCount,
    job_name: object,
    launcher: torchrun.Torchrun,
    decision: LaunchDecision,
) -> torchrun.Launch:
    """torchrun's command line: one slot for the entry point once on this host, else the
    workers of this host's world."""
    if decision.mode is LaunchMode.ONCE:
        return torchrun.once_launch(launcher, env.python, topology, knobs, knobs.master_port)
    asked = _processes(env, hps)
    return torchrun.launch(
        launcher, env.environ, env.python, topology, knobs, gpu, job_name, processes=asked
    )


def _launch_decision(
    env: Environment,
    topology: Topology,
    knobs: Settings,
    hps: hyperparameters.Hyperparameters,
    code: CodeSource,
    script: str,
) -> LaunchDecision:
    """Our workers, the entry point once, or the base's toolkit (launch_mode), from the code
    where it has been read (Environment.code_files)."""
    worlds = topology.worlds
    return launch_mode.launch_mode_of(
        knobs.launch,
        hps.sagemaker,
        topology.world,
        worlds.why if worlds else "",
        code_key(code.code_dir, script) if env.code_files is not None else None,
        env.code_files,
        code.location,
    )


def _processes(env: Environment, hps: hyperparameters.Hyperparameters) -> tuple[int, str] | None:
    """Workers per host the job asked for: SDK v3's Torchrun(process_count_per_node), or the
    processes per host SDK v2 writes for `distribution=` (the DLC's toolkit honours it for every
    launcher it runs, torchrun's included)."""
    if env.sdk and env.sdk.processes_per_host:
        return env.sdk.processes_per_host, "SDK v3 Torchrun(process_count_per_node)"
    key = "sagemaker_mpi_num_of_processes_per_host"
    value = hps.sagemaker.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, f"hyperparameter {key}"
    if value is not None:
        raise ConfigError(f"hyperparameter {key}={value!r}: a positive integer")
    return None
