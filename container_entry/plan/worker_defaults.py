"""Defaults for the workers' environment: interconnect (NCCL, EFA), threads, NCCL diagnostics,
and the warning about shared memory (its text: container_entry.common.shm). Pure: every input is a
fact the environment read.

Every value here is only a default: the plan drops any variable the user already set (or one
of its aliases: `ALIASES`), and shows each one it adds with its reason. What decides each value,
with the sources read, is in docs/gpu.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from container_entry.common import shm
from container_entry.common.layout import RunDir
from container_entry.plan.cluster import Topology

# What an unmodified HF Trainer / Accelerate script needs to run as DDP on a host with no GPU
# (docs/cpu-ddp.md): transformers passes cpu=True to accelerate's PartialState only then, and
# PartialState then builds a MULTI_CPU (gloo) state from torchrun's WORLD_SIZE.
CPU_DDP_ENV = {"ACCELERATE_USE_CPU": "true"}

# Names torch reads for the same setting (its getCvar* lists: the first one set wins, the others
# are legacy names). A user's value under any of them is theirs: we then set none.
ALIASES: Mapping[str, tuple[str, ...]] = {
    "TORCH_FR_BUFFER_SIZE": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    "TORCH_NCCL_TRACE_BUFFER_SIZE": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    "TORCH_NCCL_DUMP_ON_TIMEOUT": ("TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_NCCL_DUMP_ON_TIMEOUT"),
    "TORCH_FR_DUMP_TEMP_FILE": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"),
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": (
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    ),
}

# Flight recorder, per torch release (docs/gpu.md says what was read to decide each):
# - ring buffer: FlightRecorder's own default is 0 (off) in 2.9.0 and 2000 from 2.13 on;
FR_BUFFER_DEFAULT_ON = (2, 13)
# - TORCH_FR_* names read (first) since 2.9; the TORCH_NCCL_* names are read by every release;
FR_NAMES_SINCE = (2, 9)
# - dump on a collective timeout: on by default since pytorch PR 143446 (Dec 2024).
DUMP_ON_TIMEOUT_DEFAULT_ON = (2, 7)

# EFA presets by software version (aws-samples/awsome-distributed-training,
# 1.architectures/efa-cheatsheet.md): instances whose EFA does GPUDirect RDMA, for which the
# old presets set FI_EFA_USE_DEVICE_RDMA=1.
_RDMA_FAMILIES = re.compile(r"^(ml\.)?p[456]")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


Env = tuple[str, str]  # (value, reason)


@dataclass(frozen=True)
class Defaults:
    env: dict[str, Env]  # name -> (value, reason)
    user_aliases: tuple[str, ...] = ()  # a user's variable that stood in for one of ours
    warnings: tuple[str, ...] = field(default=())


def version_tuple(text: str | None) -> tuple[int, int, int] | None:
    """(1, 13, 2) from '1.13.2-aws', '1.22.0amzn4.0', '2.9.0+cu130'; None if not a version.
    The one parse of a version: torch's (torchrun.Torchrun), the EFA software's, the kernel's."""
    match = _VERSION.search(text or "")
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def threads(
    *,
    gpu_count: int,
    cpu_count: int,
    physical_cores: int | None,
    workers: int,
    hosts_on_machine: int = 1,
) -> tuple[str, str]:
    """OMP_NUM_THREADS: cores per worker (torchrun would force 1). `workers` counts every
    worker on this machine: with several hosts on one kernel (SageMaker local mode) each host
    seeing all cores would oversubscribe the machine."""
    workers = max(1, workers)
    shared = (
        f" ({hosts_on_machine} hosts of this job share this machine: same kernel boot id)"
        if hosts_on_machine > 1
        else ""
    )
    if gpu_count and physical_cores:
        return (
            str(max(1, physical_cores // workers)),
            f"{physical_cores} physical cores / {workers} workers on a GPU host{shared}: "
            f"hyperthreads ({cpu_count} logical CPUs) are left to DataLoader workers and NCCL's "
            "proxy threads (torchrun would force 1)",
        )
    return (
        str(max(1, cpu_count // workers)),
        f"{cpu_count} cores / {workers} workers{shared} (torchrun would force 1)",
    )


def flight_recorder(
    torch_version: str | None, trace_prefix: str, gpu: bool = True
) -> dict[str, Env]:
    """Only the flight-recorder variables that change something in this torch, under the one
    name it reads without a deprecation warning (torch 2.11 warns at every process group's start
    about each legacy TORCH_NCCL_* name it finds). The recorder holds each rank's collectives
    for the hang report (flight_recorder.py asks every rank for them); torch 2.9+ records gloo's
    too, so CPU hosts get the ring buffer; the dump torch writes by itself on a collective
    timeout is NCCL's only, written to `<trace_prefix><rank>` (RunDir.nccl_trace_prefix)."""
    release = version_tuple(torch_version)
    if release is None:
        return {}
    short = release[:2]
    label = f"torch {release[0]}.{release[1]}"
    modern = short >= FR_NAMES_SINCE
    env: dict[str, Env] = {}
    if short < FR_BUFFER_DEFAULT_ON and (gpu or modern):
        name = "TORCH_FR_BUFFER_SIZE" if modern else "TORCH_NCCL_TRACE_BUFFER_SIZE"
        env[name] = (
            "2000",
            f"flight recorder on: {label} records no collectives by default "
            "(its ring buffer defaults to 0)",
        )
    if not gpu:
        return env
    if short < DUMP_ON_TIMEOUT_DEFAULT_ON:
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = (
            "1",
            f"flight recorder dump when a collective hangs (off by default in {label})",
        )
    name = "TORCH_FR_DUMP_TEMP_FILE" if modern else "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
    env[name] = (
        trace_prefix,
        "NCCL's own dump on a collective timeout kept with the job's output "
        f"(read by {label} under this name)",
    )
    return env


def efa_preset(
    *,
    efa_devices: tuple[str, ...],
    ofi_nccl_version: str | None,
    libfabric_version: str | None,
    kernel_release: str | None,
    instance_type: str | None,
) -> tuple[dict[str, Env], list[str]]:
    """The EFA cheatsheet's preset for the plugin and libfabric in this image; never
    RDMAV_FORK_SAFE (the cheatsheet: do not use, it breaks things on newer kernels)."""
    env: dict[str, Env] = {}
    warnings: list[str] = []
    if not efa_devices:
        return env, warnings
    devices = ", ".join(efa_devices)
    ofi = version_tuple(ofi_nccl_version)
    if ofi is None:
        warnings.append(
            f"EFA devices ({devices}) but no aws-ofi-nccl plugin in the image: NCCL will talk "
            "over TCP sockets between hosts (about 10x slower); no EFA variables are set"
        )
        return env, warnings
    fabric = version_tuple(libfabric_version)
    found = f"aws-ofi-nccl {ofi_nccl_version}, libfabric {libfabric_version or 'unknown'}"
    rdma = bool(instance_type and _RDMA_FAMILIES.match(instance_type))
    env["FI_EFA_USE_HUGE_PAGE"] = (
        "0",
        f"{found}: fork() of DataLoader workers fails ('Cannot allocate memory') when huge "
        "pages run out (in the EFA cheatsheet's preset for every version)",
    )
    current = ofi >= (1, 7, 0) and fabric is not None and fabric >= (1, 18, 0)
    if not current and rdma:
        env["FI_EFA_USE_DEVICE_RDMA"] = (
            "1",
            f"{found} on {instance_type}: GPUDirect RDMA is not on by default before "
            "libfabric 1.18 with aws-ofi-nccl 1.7",
        )
    if ofi < (1, 6, 0):
        old = f"aws-ofi-nccl {ofi_nccl_version}: 1.5 or older (EFA cheatsheet preset 3.3)"
        env["FI_PROVIDER"] = ("efa", old)
        env["NCCL_PROTO"] = ("simple", old)
    kernel = version_tuple(kernel_release)
    if kernel is not None and kernel[:2] < (5, 15):
        env["FI_EFA_FORK_SAFE"] = (
            "1",
            f"kernel {kernel_release} (before 5.15): fork() with EFA memory registered",
        )
    return env, warnings


def _interface_env(topology: Topology, interfaces: tuple[str, ...] | None) -> dict[str, Env]:
    """The interface resourceconfig.json names, for NCCL and gloo, where this host has it."""
    interface = topology.network_interface
    if not interface or (interfaces is not None and interface not in interfaces):
        # SDK v3 local mode names 'ethwe', which its containers lack; NCCL and gloo would fail
        # on it, so they are left to pick the interface themselves
        return {}
    reason = "interface named by resourceconfig.json"
    return {name: (interface, reason) for name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")}


def _nccl_env(current_host: str, nccl_conf: Mapping[str, str] | None) -> dict[str, Env]:
    """NCCL's host identity and log level on a GPU host."""
    file_level = (nccl_conf or {}).get("NCCL_DEBUG")
    return {
        "NCCL_HOSTID": (
            current_host,
            "host identity for NCCL: ranks on different hosts are never taken for one host "
            "(replaces the DLC's LD_PRELOAD gethostname shim)",
        ),
        "NCCL_DEBUG": (
            "WARN",
            "NCCL warnings only"
            + (
                f", instead of NCCL_DEBUG={file_level} from /etc/nccl.conf (NCCL reads the file "
                "only for variables not in the environment)"
                if file_level and file_level.upper() != "WARN"
                else " (as the incumbent sets it)"
            ),
        ),
    }


def _without_aliases(
    env: dict[str, Env], environ: Mapping[str, str]
) -> tuple[dict[str, Env], tuple[str, ...]]:
    """`env` less each variable the user set under another of torch's names for it (`ALIASES`),
    and those names of theirs, sorted."""
    aliases: set[str] = set()
    kept = dict(env)
    for name in env:
        theirs = [a for a in ALIASES.get(name, ()) if a != name and a in environ]
        if theirs and name not in environ:
            del kept[name]
            aliases.update(theirs)
    return kept, tuple(sorted(aliases))


def worker_env(
    *,
    topology: Topology,
    gpu_count: int,
    efa_devices: tuple[str, ...],
    interfaces: tuple[str, ...] | None,
    cpu_count: int,
    workers_per_host: int,
    run_dir: RunDir,
    environ: Mapping[str, str] | None = None,
    torch_version: str | None = None,
    physical_cores: int | None = None,
    nccl_conf: Mapping[str, str] | None = None,
    ofi_nccl_version: str | None = None,
    libfabric_version: str | None = None,
    kernel_release: str | None = None,
    shm_bytes: int | None = None,
) -> Defaults:
    """The workers' defaults: name -> (value, reason), the user's aliases that replaced one,
    and warnings for the plan."""
    env = _interface_env(topology, interfaces)
    warnings: list[str] = []
    env["OMP_NUM_THREADS"] = threads(
        gpu_count=gpu_count,
        cpu_count=cpu_count,
        physical_cores=physical_cores,
        workers=workers_per_host,
    )
    if gpu_count:
        env.update(_nccl_env(topology.current_host, nccl_conf))
        preset, efa_warnings = efa_preset(
            efa_devices=efa_devices,
            ofi_nccl_version=ofi_nccl_version,
            libfabric_version=libfabric_version,
            kernel_release=kernel_release,
            instance_type=topology.instance_type,
        )
        env.update(preset)
        warnings += efa_warnings
    else:
        for name, value in CPU_DDP_ENV.items():
            env[name] = (value, "no GPU: HF Trainer/Accelerate run DDP on gloo")
    env.update(flight_recorder(torch_version, run_dir.nccl_trace_prefix, gpu=bool(gpu_count)))
    small = shm.warning(shm_bytes)
    if small:
        warnings.append(small)
    env, aliases = _without_aliases(env, environ or {})
    return Defaults(env, aliases, tuple(warnings))
