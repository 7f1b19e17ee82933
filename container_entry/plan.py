"""Pure resolution: Environment -> Plan. No I/O, no side effects; print it, test it, run it.

`build_plan` raises ConfigError for input that leaves nothing to plan (a malformed config file,
a bad setting); what it can plan around (no entry script, a script that is not there, an
unsupported torch, an environment too large to start a process with) goes into
`Plan.problems`, so `plan` can show everything else. `train` refuses a plan with problems.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from container_entry import contract, gpus, hyperparameters, settings, torchrun
from container_entry.cluster import Topology, resolve_topology
from container_entry.environment import Environment, script_candidates
from container_entry.errors import ConfigError
from container_entry.hang import PROGRESS_ENV
from container_entry.masking import MASK, Masker, is_secret_name, secret_values
from container_entry.settings import Settings
from container_entry.worker_defaults import threads, worker_env

PREFLIGHT_SCRIPT = str(Path(__file__).resolve().parent / "preflight.py")
RUN_DIR = ("output", "data", "container-entry")  # under the base dir: logs, records, stacks
MAX_ARG_STRLEN = 131072  # Linux: the most bytes one argv or environment string may hold
UNRESOLVED = "<entry script>"


def workers_of(nproc_per_node: str, gpus: int) -> int:
    """Workers per host from torchrun's value ("gpu"/"auto" from PET_* count the GPUs)."""
    return int(nproc_per_node) if nproc_per_node.isdigit() else max(1, gpus)


def run_dir(base_dir: Path | str) -> Path:
    return Path(base_dir, *RUN_DIR)


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
            f"arguments   {' '.join(self.command[1:]) or '-'}",
            f"env added   {sm_count} SM_* + {env_names or '-'}",
        ]
        if self.settings.hang_timeout:
            lines.append(
                f"hang        declared after {self.settings.hang_timeout:g} s with no output "
                "from any rank (HANG_TIMEOUT; exit 124)"
            )
        if self.user_env_kept:
            lines.append(f"env kept    {' '.join(self.user_env_kept)} (already set: left as is)")
        lines += [f"warning     {text}" for text in self.warnings]
        return self.masker().text("\n".join(lines))


def _program(env: Environment, sagemaker_hps: Mapping[str, Any]) -> str | None:
    if env.cli_args:
        return env.cli_args[0]
    program = env.environ.get("SAGEMAKER_PROGRAM") or sagemaker_hps.get("sagemaker_program")
    return program if isinstance(program, str) and program else None


def _cli_code(env: Environment, name: str) -> tuple[CodeSource, str | None]:
    """A script named on the command line: the first candidate that exists."""
    candidates = script_candidates(env.cwd, str(env.base_dir / "code"), name)
    found = next((path for path in candidates if path in env.scripts_found), None)
    script = found or candidates[0]
    problem = None
    if found is None:
        problem = f"entry script {name!r} not found: looked for {' and '.join(candidates)}"
    directory = posixpath.dirname(script)
    return CodeSource("cli", name, directory), problem


def _code_source(env: Environment, program: str, sagemaker_hps: Mapping[str, Any]) -> CodeSource:
    base = str(env.base_dir)
    extracted = posixpath.join(base, "code")
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


def _pet_int(environ: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not an integer") from None
    if not low <= value <= high:
        raise ConfigError(f"{name}={raw!r}: must be between {low} and {high}")
    return value


def _nproc(environ: Mapping[str, str], gpu: gpus.GpuCount) -> tuple[str, str]:
    raw = environ.get("PET_NPROC_PER_NODE")
    if raw is None:
        return (str(gpu.count), gpu.source) if gpu.count else ("1", "no GPU: CPU")
    if raw not in ("auto", "cpu", "gpu", "xpu") and not (raw.isdigit() and int(raw) > 0):
        raise ConfigError(
            f"PET_NPROC_PER_NODE={raw!r}: a positive integer, or auto, cpu, gpu (torchrun's values)"
        )
    return raw, "PET_NPROC_PER_NODE"


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


def build_plan(env: Environment) -> Plan:
    """Decide everything about the launch; raises ConfigError naming the bad file or value."""
    problems: list[str] = []
    topology: Topology = resolve_topology(env)
    hps = hyperparameters.split(env.hyperparameters)
    knobs = settings.resolve(env.environ, hps.settings)
    gpu = gpus.count_gpus(env.environ, env.nvidia_smi, env.nvidia_smi_error, env.gpu_driver)
    warnings: list[str] = list(gpu.warnings)
    program = _program(env, hps.sagemaker)
    user_args = list(env.cli_args[1:]) if env.cli_args else hyperparameters.to_args(hps.user)
    user_hps = dict(hps.user)
    job_name = env.environ.get("TRAINING_JOB_NAME") or hps.sagemaker.get("sagemaker_job_name")

    problems += gpu.problems
    if program is None:
        problems.append(
            "no entry script: set SAGEMAKER_PROGRAM or hyperparameter sagemaker_program, "
            "or run `train SCRIPT [ARGS...]`"
        )
        code = CodeSource("directory", str(env.base_dir / "code"), str(env.base_dir / "code"))
        script = UNRESOLVED
    elif env.cli_args:
        code, problem = _cli_code(env, program)
        problems += [problem] if problem else []
        script = posixpath.join(code.code_dir, posixpath.basename(program))
    else:
        code = _code_source(env, program, hps.sagemaker)
        script = posixpath.join(code.code_dir, program)

    launcher = torchrun.Torchrun(env.torch_version or "0.0")
    if env.torch_version is None:
        problems.append(f"torch is not installed for {env.python}: torchrun cannot start")
    elif not launcher.supported:
        problems.append(
            f"torch {env.torch_version} is older than the oldest supported release "
            f"({'.'.join(map(str, torchrun.OLDEST))})"
        )

    nproc, nproc_source = _nproc(env.environ, gpu)
    master_port = _pet_int(env.environ, "PET_MASTER_PORT", knobs.master_port, 1, 65534)
    master_addr = env.environ.get("PET_MASTER_ADDR") or topology.master_addr
    restarts = _pet_int(env.environ, "PET_MAX_RESTARTS", knobs.max_restarts, 0, 10**6)
    # PET_NPROC_PER_NODE, when set, drops this flag and torchrun reads the user's value itself
    size = {"nnodes": str(len(topology.hosts)), "nproc-per-node": nproc}
    # the bootstrap delivers a stop itself (launch.py); should anything else signal torchrun,
    # a torchrun that can be told so gives the ranks the same grace
    stop = (
        {"shutdown-timeout": str(int(knobs.stop_grace_period))}
        if launcher.handles_stop_grace
        else {}
    )
    rendezvous = torchrun.rendezvous_flags(topology, master_addr, master_port, restarts, job_name)
    flags, pet_kept = torchrun.flags(env.environ, {**size, **rendezvous, **stop})
    argv = torchrun.command(env.python, flags)
    preflight = knobs.preflight == "true" or (knobs.preflight == "auto" and len(topology.hosts) > 1)

    wanted: dict[str, EnvVar] = {}
    sm = contract.sm_env(
        base_dir=env.base_dir,
        topology=topology,
        user_hyperparameters=user_hps,
        sagemaker_hyperparameters=hps.sagemaker,
        user_args=user_args,
        program=posixpath.basename(program or UNRESOLVED),
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
    wanted[PROGRESS_ENV] = EnvVar(
        str(run_dir(env.base_dir) / "progress"),
        "touch it (or call container_entry.hang.report_progress()) to count as output for "
        + (f"HANG_TIMEOUT ({knobs.hang_timeout:g} s)" if knobs.hang_timeout else "HANG_TIMEOUT"),
    )
    defaults = worker_env(
        topology=topology,
        gpu_count=gpu.count,
        efa_devices=env.efa_devices,
        interfaces=env.interfaces,
        cpu_count=env.cpu_count,
        workers_per_host=workers_of(nproc, gpu.count),
        run_dir=str(run_dir(env.base_dir)),
        environ=env.environ,
        torch_version=env.torch_version,
        physical_cores=env.physical_cores,
        nccl_conf=env.nccl_conf,
        ofi_nccl_version=env.ofi_nccl_version,
        libfabric_version=env.libfabric_version,
        kernel_release=env.kernel_release,
        shm_bytes=env.shm_bytes,
    )
    for name, (value, reason) in defaults.env.items():
        wanted[name] = EnvVar(value, reason)
    warnings += defaults.warnings
    if restarts:
        wanted["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = EnvVar(
            "1", "restarts: every attempt gets a fresh store (no stale peer addresses)"
        )

    added = {k: v for k, v in wanted.items() if k not in env.environ}
    kept = sorted(
        {k for k in wanted if k in env.environ} | set(pet_kept) | set(defaults.user_aliases)
    )
    command = (script, *user_args)
    child_env = {**env.environ, **{k: v.value for k, v in added.items()}}
    oversized = _oversized(child_env, command, env.arg_max, user_hps)
    if oversized:
        problems.append(oversized)
    secret_pairs = [
        *env.environ.items(),
        *env.hyperparameters.items(),
        *_argv_pairs(user_args),
    ]
    return Plan(
        topology=topology,
        master_addr=master_addr,
        master_port=master_port,
        coordinated=topology.coordinated and len(topology.hosts) > 1,
        nproc_per_node=nproc,
        nproc_source=nproc_source,
        backend="nccl" if gpu.count else "gloo",
        num_gpus=gpu.count,
        torch_version=env.torch_version,
        program=program,
        code=code,
        user_args=tuple(user_args),
        hyperparameters=user_hps,
        argv=argv,
        command=command,
        env=added,
        user_env_kept=tuple(kept),
        settings=knobs,
        max_restarts=restarts,
        preflight=(PREFLIGHT_SCRIPT,) if preflight else (),
        problems=tuple(problems),
        gpu_problem=bool(gpu.problems),
        secrets=tuple(secret_values(secret_pairs)),
        warnings=tuple(warnings),
        cpu_count=env.cpu_count,
        physical_cores=env.physical_cores,
        boot_id=env.boot_id,
    )


def _argv_pairs(args: Sequence[str]) -> list[tuple[str, str]]:
    """(name, value) for `--name value` and `--name=value` in a command line, so a credential
    passed as an argument (`train train.py --hf_token ...`) is masked like a hyperparameter."""
    pairs = []
    for index, arg in enumerate(args):
        if not arg.startswith("-"):
            continue
        name, equals, value = arg.lstrip("-").partition("=")
        if equals:
            pairs.append((name, value))
        elif index + 1 < len(args):
            pairs.append((name, args[index + 1]))
    return pairs
