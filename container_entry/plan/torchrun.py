"""What the torchrun in this image can do, and the command line we give it.

The bootstrap decides torchrun's options from the torch actually installed (its version read
from the package metadata, without importing torch) and passes only options that version has.
`FLAG_SINCE` holds the first release whose launcher accepts each option we may pass;
tests/compat checks it, and the plan's command lines, against the real argument parser of every
supported release.

The user's script and its arguments never appear on torchrun's command line: argparse matches
abbreviations of torchrun's options even after the script name (pytorch issue 120601), so a
hyperparameter `--log` or `--node` would be taken as torchrun's own. torchrun starts our worker
module with no arguments; the worker reads the script's command line from a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from container_entry.common.errors import ConfigError
from container_entry.common.programs import TORCHRUN_MODULE, WORKER_MODULE
from container_entry.plan.cluster import Topology, source_of
from container_entry.plan.gpus import GpuCount
from container_entry.plan.settings import Settings
from container_entry.plan.worker_defaults import version_tuple

# The oldest release we support: the torch of the oldest listed Hugging Face training DLC
# (huggingface-pytorch-training:2.5.1-transformers4.49.0).
OLDEST = (2, 5)
# First release whose launcher accepts the option (tests/compat/test_torchrun_flags.py).
FLAG_SINCE: Mapping[str, tuple[int, int]] = {
    "nnodes": OLDEST,
    "nproc-per-node": OLDEST,
    "node-rank": OLDEST,
    "master-addr": OLDEST,
    "master-port": OLDEST,
    "max-restarts": OLDEST,
    "rdzv-backend": OLDEST,
    "rdzv-endpoint": OLDEST,
    "rdzv-id": OLDEST,
    "rdzv-conf": OLDEST,
    "local-addr": OLDEST,
    "standalone": OLDEST,
    # torch's own SIGTERM -> SIGKILL delay for workers; before it, a fixed 30 s
    "shutdown-timeout": (2, 12),
}


@dataclass(frozen=True)
class Torchrun:
    """The launcher of one torch release."""

    version: str  # as installed, e.g. "2.9.0+cu128"

    @property
    def release(self) -> tuple[int, int]:
        release = version_tuple(self.version)
        if release is None:
            raise ConfigError(f"torch version {self.version!r} is not a release number")
        return release[:2]

    def has(self, flag: str) -> bool:
        return self.release >= FLAG_SINCE[flag]

    @property
    def supported(self) -> bool:
        return self.release >= OLDEST

    @property
    def handles_stop_grace(self) -> bool:
        """Whether torchrun itself can give the workers our stop grace period after SIGTERM;
        if not, it kills them 30 s after the signal and the bootstrap delivers the stop."""
        return self.has("shutdown-timeout")


def flags(environ: Mapping[str, str], wanted: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """`--flag value` pairs, leaving out every flag the user set as PET_<FLAG> (torchrun reads
    those itself, and a flag on the command line would beat the user's value)."""
    argv: list[str] = []
    kept: list[str] = []
    for flag, value in wanted.items():
        pet = "PET_" + flag.upper().replace("-", "_")
        if pet in environ:
            kept.append(pet)
        else:
            argv += [f"--{flag}", value]
    return argv, kept


def command(python: str, flag_argv: list[str]) -> tuple[str, ...]:
    """torchrun's whole command line: its options, then our worker module and nothing else."""
    return (python, "-m", TORCHRUN_MODULE, *flag_argv, "-m", WORKER_MODULE)


def rendezvous_flags(
    topology: Topology, master_addr: str, master_port: int, restarts: int, job_name: object
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
    wanted = {
        "rdzv-backend": "c10d",
        "rdzv-endpoint": f"{master_addr}:{master_port}",
        "rdzv-id": str(job_name or "container-entry"),
        "rdzv-conf": f"is_host={'true' if topology.node_rank == 0 else 'false'}",
    }
    # the node that c10d makes rank 0 advertises this address to every worker (None: torch's
    # own default, the host's FQDN)
    local = source_of(topology).local_addr(topology)
    if local is not None:
        wanted["local-addr"] = local
    return {**wanted, "max-restarts": str(restarts)}


def _pet_int(environ: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """PET_<NAME>, which torchrun itself reads, when the user set it; else our `default`."""
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


def _nproc(
    environ: Mapping[str, str], gpu: GpuCount, asked: tuple[int, str] | None
) -> tuple[str, str]:
    """Workers per host as torchrun takes them, and why: PET_NPROC_PER_NODE, else what the job
    asked for (`asked`: the count and who asked), else a GPU each."""
    raw = environ.get("PET_NPROC_PER_NODE")
    if raw is None and asked:
        return str(asked[0]), asked[1]
    if raw is None:
        return (str(gpu.count), gpu.source) if gpu.count else ("1", "no GPU: CPU")
    if raw not in ("auto", "cpu", "gpu", "xpu") and not (raw.isdigit() and int(raw) > 0):
        raise ConfigError(
            f"PET_NPROC_PER_NODE={raw!r}: a positive integer, or auto, cpu, gpu (torchrun's values)"
        )
    return raw, "PET_NPROC_PER_NODE"


@dataclass(frozen=True)
class Launch:
    """torchrun's command line and the values in it."""

    nproc: str
    nproc_source: str
    master_addr: str
    master_port: int
    restarts: int
    argv: tuple[str, ...]
    pet_kept: tuple[str, ...]  # the PET_* variables torchrun reads itself instead of a flag


def _stop_flags(launcher: Torchrun, knobs: Settings) -> dict[str, str]:
    """The bootstrap delivers a stop itself (supervise/teardown.py); should anything else signal
    torchrun, a torchrun that can be told so gives the ranks the same grace."""
    if not launcher.handles_stop_grace:
        return {}
    return {"shutdown-timeout": str(int(knobs.stop_grace_period))}


def once_launch(
    launcher: Torchrun, python: str, topology: Topology, knobs: Settings, master_port: int
) -> Launch:
    """torchrun hosting the entry point once on this host (one slot, our rank wrapper in it):
    a rendezvous of its own on a port the kernel picks (`--standalone`), never 29500 or any
    other port the user's own launcher may take, no restarts. Every flag is on the command
    line, so the PET_* variables meant for the user's launcher never steer ours."""
    flag_argv = ["--standalone", "--nnodes", "1", "--nproc-per-node", "1", "--max-restarts", "0"]
    # the rendezvous never leaves this host: its store is reached on loopback, never through
    # this machine's own name (which need not resolve: a container's, a SageMaker host's)
    flag_argv += ["--local-addr", "127.0.0.1"]
    for flag, value in _stop_flags(launcher, knobs).items():
        flag_argv += [f"--{flag}", value]
    reason = "once per host: the entry point starts its workers itself"
    return Launch("1", reason, topology.master_addr, master_port, 0, command(python, flag_argv), ())


def launch(
    launcher: Torchrun,
    environ: Mapping[str, str],
    python: str,
    topology: Topology,
    knobs: Settings,
    gpu: GpuCount,
    job_name: object,
    processes: tuple[int, str] | None = None,
) -> Launch:
    """torchrun's command line for this host: workers per host, the master, restarts, the stop
    grace where this torchrun takes it; every PET_* variable the user set wins (torchrun reads
    it itself)."""
    workers, workers_source = _nproc(environ, gpu, processes)
    master_port = _pet_int(environ, "PET_MASTER_PORT", knobs.master_port, 1, 65534)
    master_addr = environ.get("PET_MASTER_ADDR") or topology.master_addr
    restarts = _pet_int(environ, "PET_MAX_RESTARTS", knobs.max_restarts, 0, 10**6)
    # PET_NPROC_PER_NODE, when set, drops this flag and torchrun reads the user's value itself
    size = {"nnodes": str(topology.nnodes), "nproc-per-node": workers}
    stop = _stop_flags(launcher, knobs)
    rendezvous = rendezvous_flags(topology, master_addr, master_port, restarts, job_name)
    argv, pet_kept = flags(environ, {**size, **rendezvous, **stop})
    return Launch(
        workers,
        workers_source,
        master_addr,
        master_port,
        restarts,
        command(python, argv),
        tuple(pet_kept),
    )
