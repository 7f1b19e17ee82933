"""Pure resolution: Environment -> Plan. No I/O, no side effects; print it, test it, run it."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from container_entry import contract, gpus, hyperparameters, settings
from container_entry.cluster import Topology, resolve_topology
from container_entry.environment import Environment
from container_entry.errors import ConfigError
from container_entry.fabric import fabric_env
from container_entry.secrets import mask_argv, mask_mapping, redact, secret_values

TORCHRUN = ("-m", "torch.distributed.run")
WORKER_MODULE = "container_entry.worker"
PREFLIGHT_SCRIPT = str(Path(__file__).resolve().parent / "preflight.py")


@dataclass(frozen=True)
class EnvVar:
    value: str
    reason: str


@dataclass(frozen=True)
class CodeSource:
    kind: str  # "directory" | "s3" | "archive" | "cli"
    location: str  # where the code comes from
    code_dir: str  # where the entry script runs from (cwd of the workers)


@dataclass(frozen=True)
class Plan:
    mode: str
    hosts: tuple[str, ...]
    current_host: str
    node_rank: int
    master_addr: str
    master_port: int
    coordination_port: int  # the bootstraps' own side channel on the master (master_port + 1)
    wait_for: tuple[str, ...]  # host names that must resolve before launch
    coordinated: bool  # whether the bootstraps of all hosts relay failures to each other
    nproc_per_node: str  # what torchrun will use; a string because PET_ may say "gpu"/"auto"
    nproc_source: str
    backend: str
    num_gpus: int
    program: str
    code: CodeSource
    user_args: tuple[str, ...]
    hyperparameters: dict[str, Any]
    argv: tuple[str, ...]  # the torchrun command line, the script and its arguments
    env: dict[str, EnvVar]  # variables the bootstrap adds, each with its reason
    user_env_kept: tuple[str, ...]  # variables we would have set but the user already had
    max_restarts: int = 0  # what torchrun will use (PET_MAX_RESTARTS wins)
    preflight_argv: tuple[str, ...] = ()  # empty: no preflight
    settings: dict[str, Any] = field(default_factory=dict)
    install_requirements: bool = True

    def to_dict(self, *, masked: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data["env"] = {k: {"value": v.value, "reason": v.reason} for k, v in self.env.items()}
        if masked:
            for name, item in data["env"].items():
                item["value"] = mask_mapping({name: item["value"]})[name]
            data["argv"] = mask_argv(self.argv)
            data["user_args"] = mask_argv(self.user_args)
            data["hyperparameters"] = mask_mapping(self.hyperparameters)
            data = redact(data, self._secrets())
        return data

    def _secrets(self) -> list[str]:
        env_values = {name: var.value for name, var in self.env.items()}
        return secret_values({**self.hyperparameters, **env_values})

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    def summary(self) -> str:
        """The compact block printed at start."""
        hosts = ", ".join(self.hosts)
        env_names = " ".join(sorted(k for k in self.env if not k.startswith("SM_")))
        sm_count = sum(1 for k in self.env if k.startswith("SM_"))
        lines = [
            f"mode        {self.mode}",
            f"hosts       {len(self.hosts)}: {hosts}",
            f"this host   {self.current_host} (node rank {self.node_rank})",
            f"master      {self.master_addr}:{self.master_port} "
            f"(coordination :{self.coordination_port})",
            f"workers     {self.nproc_per_node} per host ({self.nproc_source}), {self.backend}",
            f"code        {self.code.code_dir}/{self.program} ({self.code.kind}: "
            f"{self.code.location})",
            f"argv        {' '.join(mask_argv(self.argv))}",
            f"env added   {sm_count} SM_* + {env_names or '-'}",
        ]
        if self.user_env_kept:
            lines.append(f"env kept    {' '.join(self.user_env_kept)} (already set: left as is)")
        return str(redact("\n".join(lines), self._secrets()))


def _program(env: Environment, sagemaker_hps: Mapping[str, Any]) -> str:
    if env.cli_args:
        return posixpath.basename(env.cli_args[0])
    program = env.environ.get("SAGEMAKER_PROGRAM") or sagemaker_hps.get("sagemaker_program")
    if not program or not isinstance(program, str):
        raise ConfigError(
            "no entry script: set SAGEMAKER_PROGRAM or hyperparameter sagemaker_program, "
            "or run `train SCRIPT [ARGS...]`"
        )
    return program


def _code_source(env: Environment, program: str, sagemaker_hps: Mapping[str, Any]) -> CodeSource:
    base = str(env.base_dir)
    extracted = posixpath.join(base, "code")
    if env.cli_args:
        script = posixpath.join(env.cwd, env.cli_args[0])
        return CodeSource("cli", env.cli_args[0], posixpath.dirname(posixpath.normpath(script)))
    submit = sagemaker_hps.get("sagemaker_submit_directory") or env.environ.get(
        "SAGEMAKER_SUBMIT_DIRECTORY"
    )
    if submit:
        submit = str(submit)
        if submit.startswith("s3://"):
            return CodeSource("s3", submit, extracted)
        if submit.endswith((".tar.gz", ".tgz")):
            return CodeSource("archive", submit, extracted)
        return CodeSource("directory", submit, submit)
    channel = posixpath.join(base, "input", "data", "code")
    if env.code_channel_entries:
        archives = [e for e in env.code_channel_entries if e.endswith((".tar.gz", ".tgz"))]
        if program not in env.code_channel_entries and archives:
            return CodeSource("archive", posixpath.join(channel, archives[0]), extracted)
        return CodeSource("directory", channel, channel)
    return CodeSource("directory", extracted, extracted)


def _channels(env: Environment) -> dict[str, str]:
    names = set(env.input_data_config) | set(env.local_channels)
    return {name: str(env.base_dir / "input" / "data" / name) for name in sorted(names)}


def _torchrun_flags(
    environ: Mapping[str, str], flags: Mapping[str, str]
) -> tuple[list[str], list[str]]:
    """torchrun flags, leaving out every one the user set as PET_<FLAG> (torchrun reads it)."""
    argv: list[str] = []
    kept: list[str] = []
    for flag, value in flags.items():
        pet = "PET_" + flag.upper().replace("-", "_")
        if pet in environ:
            kept.append(pet)
        else:
            argv += [f"--{flag}", value]
    return argv, kept


def _rendezvous(
    topology: Topology,
    master_addr: str,
    master_port: int,
    restarts: int,
    job_name: object,
) -> dict[str, str]:
    """How the hosts meet: torchrun's static rendezvous, or c10d's when the group may restart.

    Static rendezvous keeps one TCPStore for every attempt with no per-attempt prefix, so a
    restarted rank can read a dead peer's address from the first attempt and fail to connect;
    c10d's rendezvous, with its store not shared with the workers (the plan sets
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE), gives every attempt a fresh store. Node rank 0
    hosts the rendezvous store (said outright: resolving the master's name is no proof of being
    it); where the host names are real, each host advertises its own, so whichever node c10d
    makes rank 0 is reached by every worker.
    """
    if restarts == 0:
        return {
            "node-rank": str(topology.node_rank),
            "master-addr": master_addr,
            "master-port": str(master_port),
            "max-restarts": "0",
        }
    flags = {
        "rdzv-backend": "c10d",
        "rdzv-endpoint": f"{master_addr}:{master_port}",
        "rdzv-id": str(job_name or "container-entry"),
        "rdzv-conf": f"is_host={'true' if topology.node_rank == 0 else 'false'}",
    }
    # the node that c10d makes rank 0 advertises this address to every worker
    if len(topology.hosts) == 1:
        flags["local-addr"] = "127.0.0.1"
    elif topology.coordinated:  # a source that knows every host's real name (SageMaker)
        flags["local-addr"] = topology.current_host
    # else (torchrun-style env: host names unknown) torch's own default, the host's FQDN
    return {**flags, "max-restarts": str(restarts)}


def _int_or(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        raise ConfigError(f"PET_MAX_RESTARTS={value!r}: not an integer") from None


def build_plan(env: Environment) -> Plan:
    """Decide everything about the launch; raises ConfigError naming the bad file or value."""
    topology: Topology = resolve_topology(env)
    hps = hyperparameters.split(env.hyperparameters)
    knobs = settings.resolve(env.environ, hps.knobs)
    gpu = gpus.count_gpus(env.environ, env.nvidia_smi)
    program = _program(env, hps.sagemaker)
    code = _code_source(env, program, hps.sagemaker)
    user_args = list(env.cli_args[1:]) if env.cli_args else hyperparameters.to_args(hps.user)
    user_hps = dict(hps.user)
    job_name = env.environ.get("TRAINING_JOB_NAME") or hps.sagemaker.get("sagemaker_job_name")

    nproc, nproc_source = (str(gpu.count), gpu.source) if gpu.count else ("1", "no GPU: CPU")
    if "PET_NPROC_PER_NODE" in env.environ:
        nproc, nproc_source = env.environ["PET_NPROC_PER_NODE"], "PET_NPROC_PER_NODE"
    master_port = int(env.environ.get("PET_MASTER_PORT") or knobs["master_port"])
    master_addr = env.environ.get("PET_MASTER_ADDR") or topology.master_addr
    restarts = _int_or(env.environ.get("PET_MAX_RESTARTS"), knobs["max_restarts"])
    size = {"nnodes": str(len(topology.hosts)), "nproc-per-node": str(gpu.count or 1)}
    stop = {"shutdown-timeout": str(int(knobs["stop_grace_period"]))}
    flags, pet_kept = _torchrun_flags(
        env.environ,
        {**size, **_rendezvous(topology, master_addr, master_port, restarts, job_name), **stop},
    )
    # preflight is one attempt: static rendezvous, no restarts
    preflight_flags, _ = _torchrun_flags(
        env.environ,
        {**size, **_rendezvous(topology, master_addr, master_port, 0, job_name), **stop},
    )
    script = posixpath.join(code.code_dir, program)
    # each rank runs the script through our wrapper (tagged live logs, result record)
    argv = (env.python, *TORCHRUN, *flags, "-m", WORKER_MODULE, script, *user_args)
    preflight = knobs["preflight"] == "true" or (
        knobs["preflight"] == "auto" and len(topology.hosts) > 1
    )
    preflight_argv = (
        (env.python, *TORCHRUN, *preflight_flags, "-m", WORKER_MODULE, PREFLIGHT_SCRIPT)
        if preflight
        else ()
    )

    wanted: dict[str, EnvVar] = {}
    sm = contract.sm_env(
        base_dir=env.base_dir,
        topology=topology,
        user_hyperparameters=user_hps,
        sagemaker_hyperparameters=hps.sagemaker,
        user_args=user_args,
        program=program,
        module_dir=code.location if code.kind in ("s3", "archive") else code.code_dir,
        channels=_channels(env),
        resource_config=env.resource_config or {},
        input_data_config=env.input_data_config,
        num_gpus=gpu.count,
        num_cpus=env.cpu_count,
        environ=env.environ,
    )
    for name, value in sm.items():
        wanted[name] = EnvVar(value, "SageMaker contract (as sagemaker-training exports it)")
    if job_name:
        wanted["SAGEMAKER_JOB_NAME"] = EnvVar(str(job_name), "transformers detects SageMaker")
    wanted["CURRENT_HOST"] = EnvVar(topology.current_host, "SageMaker contract")
    wanted["SM_CHECKPOINT_DIR"] = EnvVar(
        str(env.base_dir / "checkpoints"), "where SageMaker syncs checkpoints with S3 (resume)"
    )
    wanted["PYTHONUNBUFFERED"] = EnvVar("1", "live logs: print reaches stdout at once")
    wanted["PYTHONPATH"] = EnvVar(code.code_dir, "user modules importable, as the incumbent")
    fabric = fabric_env(
        topology=topology,
        gpu_count=gpu.count,
        efa_devices=env.efa_devices,
        interfaces=env.interfaces,
        cpu_count=env.cpu_count,
        workers_per_host=int(nproc) if nproc.isdigit() else max(1, gpu.count),
        run_dir=posixpath.join(str(env.base_dir), "output", "data", "container-entry"),
    )
    for name, (value, reason) in fabric.items():
        wanted[name] = EnvVar(value, reason)
    if restarts:
        wanted["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = EnvVar(
            "1", "restarts: every attempt gets a fresh store (no stale peer addresses)"
        )

    added = {k: v for k, v in wanted.items() if k not in env.environ}
    kept = sorted({k for k in wanted if k in env.environ} | set(pet_kept))
    return Plan(
        mode=topology.source,
        hosts=topology.hosts,
        current_host=topology.current_host,
        node_rank=topology.node_rank,
        master_addr=master_addr,
        master_port=master_port,
        coordination_port=master_port + 1,
        wait_for=topology.wait_for,
        coordinated=topology.coordinated and len(topology.hosts) > 1,
        nproc_per_node=nproc,
        nproc_source=nproc_source,
        backend="nccl" if gpu.count else "gloo",
        num_gpus=gpu.count,
        program=program,
        code=code,
        user_args=tuple(user_args),
        hyperparameters=user_hps,
        argv=tuple(argv),
        env=added,
        user_env_kept=tuple(kept),
        preflight_argv=preflight_argv,
        max_restarts=restarts,
        settings=knobs,
        install_requirements=bool(knobs["install_requirements"]),
    )
