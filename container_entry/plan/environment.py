"""Read where we are (SageMaker's /opt/ml files, env vars, GPUs) into one frozen object.

This is the only place that reads the outside world for planning; everything downstream of
`Environment` is pure and unit-tested from hand-built instances.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container_entry.common import offspring, shm
from container_entry.common.errors import ConfigError
from container_entry.plan import gpus, sdk_driver
from container_entry.plan.sdk_driver import SdkJob

DEFAULT_BASE_DIR = "/opt/ml"


@dataclass(frozen=True)
class Environment:
    base_dir: Path
    environ: Mapping[str, str]
    resource_config: Mapping[str, Any] | None  # None: not under SageMaker (local mode)
    hyperparameters: Mapping[str, Any]  # raw, as found in hyperparameters.json
    input_data_config: Mapping[str, Any]
    nvidia_smi: str | None  # `nvidia-smi -L` output, None without a driver
    cpu_count: int
    hostname: str
    python: str
    cwd: str = "/"
    cli_args: tuple[str, ...] = ()  # `train SCRIPT ARGS...` in local mode
    code_dir_entries: tuple[str, ...] = ()  # names in <base>/code
    code_channel_entries: tuple[str, ...] = ()  # names in <base>/input/data/code
    local_channels: tuple[str, ...] = field(default=())  # dirs in <base>/input/data
    efa_devices: tuple[str, ...] = ()  # RDMA devices bound to the efa driver
    interfaces: tuple[str, ...] | None = None  # network interfaces here; None: unknown
    torch_version: str | None = None  # of the torch installed beside us; None: not installed
    scripts_found: tuple[str, ...] = ()  # which of script_candidates() exist as files
    arg_max: int = 2097152  # the kernel's limit on a new process's argv + environment
    # --- GPU host facts (gpus.py, worker_defaults.py; docs/gpu.md) ---
    nvidia_smi_error: str | None = None  # why `nvidia-smi -L` gave no output (None: no binary)
    gpu_driver: tuple[str, ...] = ()  # /proc/driver/nvidia/gpus/*, /dev/nvidiaN found
    physical_cores: int | None = None  # distinct cores under the CPUs we may run on
    shm_bytes: int | None = None  # size of /dev/shm; None: unknown
    nccl_conf: Mapping[str, str] = field(default_factory=dict)  # /etc/nccl.conf's variables
    ofi_nccl_version: str | None = None  # aws-ofi-nccl in the image (read only with EFA devices)
    libfabric_version: str | None = None
    kernel_release: str | None = None  # os.uname().release: the host's kernel
    boot_id: str | None = None  # this kernel's boot id: hosts that share one share a machine
    # --- SageMaker SDK v3's own start, taken over (sdk_driver, sdk_start) ---
    sdk: SdkJob | None = None
    sdk_env: Mapping[str, str] = field(default_factory=dict)  # its environment.py's SM_*
    # --- what sagemaker-training reads from the machine for the SM_* values (contract.py) ---
    all_cpus: int = 1  # os.cpu_count(): the machine's CPUs, not only those we may run on
    neuron_cores: int = 0  # NeuronCores (read_neuron_cores)
    smddprun: bool = False  # `smddprun` found on PATH
    smddpmprun: bool = False

    @property
    def config_dir(self) -> Path:
        return self.base_dir / "input" / "config"

    @property
    def listed_gpus(self) -> int:
        """The GPUs `nvidia-smi -L` lists (its lines starting "GPU "), whatever
        CUDA_VISIBLE_DEVICES says: the DLC's SM_NUM_GPUS (0 where nvidia-smi gave nothing)."""
        return sum(1 for line in (self.nvidia_smi or "").split("\n") if line.startswith("GPU "))


def base_dir_from(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)


def read_json(path: Path) -> Any:
    """Load a config file (a JSON object); any problem becomes one line naming the file."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read ({error.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{path}: not valid UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start})"
        ) from None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"{path}: malformed JSON ({error})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def script_candidates(cwd: str, code_dir: str, name: str) -> tuple[str, ...]:
    """Where a script named on the command line may be: as given (relative to the working
    directory), then in the code directory, where `-v "$PWD":/opt/ml/code` puts it."""
    if posixpath.isabs(name):
        return (posixpath.normpath(name),)
    return tuple(
        dict.fromkeys(posixpath.normpath(posixpath.join(d, name)) for d in (cwd, code_dir))
    )


def _torch_version() -> str | None:
    """torch's version as importlib.metadata gives it (the first `torch-*.dist-info` along
    sys.path, its METADATA's Version), read without importing that library: its own import
    costs 20-30 ms of the bootstrap's start (docs/benchmarks.md, "READY"). Anything else (an
    egg, two in one folder, no METADATA): importlib.metadata itself."""
    for entry in sys.path:
        try:
            found = sorted(n for n in os.listdir(entry or ".") if _TORCH_INFO.fullmatch(n))
        except OSError:  # not a folder (a zip), gone
            continue
        if len(found) == 1:
            version = _metadata_version(Path(entry or ".") / found[0] / "METADATA")
            if version:
                return version
        if found:
            break
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


_TORCH_INFO = re.compile(r"torch-[^-]+\.dist-info")


def _metadata_version(path: Path) -> str | None:
    try:
        with path.open(encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("Version:"):
                    return line.partition(":")[2].strip() or None
                if not line.strip():  # the headers end
                    break
    except (OSError, UnicodeDecodeError):
        pass
    return None


def _arg_max() -> int:
    try:
        return int(os.sysconf("SC_ARG_MAX"))
    except (OSError, ValueError):
        return 131072 * 16


def _optional_json(path: Path) -> dict[str, Any] | None:
    return read_json(path) if path.exists() else None


def _entries(path: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(entry.name for entry in path.iterdir()))
    except OSError:
        return ()


def _interfaces() -> tuple[str, ...] | None:
    try:
        return tuple(sorted(name for _, name in socket.if_nameindex()))
    except OSError:
        return None


def read_efa_devices(sys_root: Path = Path("/sys")) -> tuple[str, ...]:
    """EFA from the machine itself (devices bound to the `efa` driver), not an instance list:
    the plan's EFA defaults and the preflight's check of NCCL's network both read it here."""
    devices = []
    for device in _entries(sys_root / "class" / "infiniband"):
        driver = sys_root / "class" / "infiniband" / device / "device" / "driver"
        try:
            if os.path.basename(os.readlink(driver)) == "efa":
                devices.append(device)
        except OSError:
            continue
    return tuple(devices)


# --- GPU host facts: readers with injectable roots (tests use fake trees) ---

_OFI_VERSION = re.compile(rb"aws-ofi-nccl (\d+\.\d+\.\d+[\w.-]*)")
_LIBFABRIC_PACKAGE = re.compile(r"libfabric(?:-aws)?[_-](\d+\.\d+\.\d+[\w.]*?)(?:[_-]|\s|$)")
OFI_NCCL_DIRS = ("amazon/ofi-nccl", "aws-ofi-nccl", "amazon/aws-ofi-nccl")


def read_boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """The running kernel's boot id: containers on one machine see the same one, so hosts of a
    job that share a machine (SageMaker local mode, a docker cluster) can tell."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def read_physical_cores(
    cpus: set[int] | None = None, sys_root: Path = Path("/sys"), proc_root: Path = Path("/proc")
) -> int | None:
    """Distinct (package, core) pairs among the CPUs this process may run on: hyperthreads of
    one core count once. From sysfs topology, else /proc/cpuinfo; None when neither says."""
    if cpus is None:
        cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
    cores = set()
    for cpu in sorted(cpus):
        topology = sys_root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        try:
            package = (topology / "physical_package_id").read_text().strip()
            core = (topology / "core_id").read_text().strip()
        except OSError:
            break
        cores.add((package, core))
    else:
        if cores:
            return len(cores)
    try:
        text = (proc_root / "cpuinfo").read_text()
    except OSError:
        return None
    cores = set()
    for block in text.split("\n\n"):
        pairs = (line.partition(":") for line in block.splitlines())
        fields = {k.strip(): v.strip() for k, _, v in pairs}
        if (
            "processor" in fields
            and "core id" in fields
            and (not cpus or int(fields["processor"]) in cpus)
        ):
            cores.add((fields.get("physical id", "0"), fields["core id"]))
    return len(cores) or None


def read_nccl_conf(path: Path = Path("/etc/nccl.conf")) -> dict[str, str]:
    """NAME=VALUE lines of NCCL's config file (NCCL reads it for variables not in the env)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    values = {}
    for line in text.splitlines():
        name, equals, value = line.strip().partition("=")
        if equals and name and not name.startswith("#"):
            values[name.strip()] = value.strip()
    return values


def _scan(path: Path, pattern: re.Pattern[bytes]) -> str | None:
    """The first match of `pattern` in a (binary) file, read in chunks."""
    try:
        with path.open("rb") as handle:
            tail = b""
            while chunk := handle.read(1 << 20):
                match = pattern.search(tail + chunk)
                if match:
                    return match.group(1).decode("ascii", "replace")
                tail = chunk[-128:]
    except OSError:
        return None
    return None


def read_efa_software(opt_root: Path = Path("/opt")) -> tuple[str | None, str | None]:
    """(aws-ofi-nccl version, libfabric version) in the image. The plugin's library embeds
    "Initializing aws-ofi-nccl <version>" (its PACKAGE_STRING); libfabric's version comes from
    its pkg-config file, else the EFA installer's package list."""
    ofi = None
    for directory in OFI_NCCL_DIRS:
        for library in sorted((opt_root / directory).glob("lib*/libnccl-net*.so*")):
            ofi = _scan(library, _OFI_VERSION)
            if ofi:
                break
        if ofi:
            break
    fabric = None
    efa = opt_root / "amazon" / "efa"
    for pc in sorted(efa.glob("lib*/pkgconfig/libfabric.pc")):
        try:
            for line in pc.read_text(errors="replace").splitlines():
                if line.startswith("Version:"):
                    fabric = line.split(":", 1)[1].strip()
        except OSError:
            continue
    if fabric is None:
        try:
            packages = (opt_root / "amazon" / "efa_installed_packages").read_text(errors="replace")
        except OSError:
            packages = ""
        match = _LIBFABRIC_PACKAGE.search(packages)
        fabric = match.group(1) if match else None
    return ofi, fabric


NEURON_LS_TIMEOUT = 30.0
TRN2_48XLARGE = "trn2.48xlarge"  # sagemaker-training counts its NeuronCores by name: 64


def read_neuron_cores(instance_type: object, timeout: float = NEURON_LS_TIMEOUT) -> int:
    """NeuronCores as sagemaker-training counts them for SM_NUM_NEURONS: 64 on a trn2.48xlarge,
    else the `nc_count`s `neuron-ls -j` reports; 0 where it is absent or says nothing usable
    (where the toolkit would fail on a garbled answer, the count is 0 here)."""
    if isinstance(instance_type, str) and TRN2_48XLARGE in instance_type:
        return 64
    binary = shutil.which("neuron-ls")
    if binary is None:
        return 0
    try:
        result = offspring.run(
            [binary, "-j"], capture_output=True, text=True, timeout=timeout, check=False
        )
        devices = json.loads(result.stdout) if result.returncode == 0 else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0
    if not isinstance(devices, list):
        return 0
    counts = [d.get("nc_count", 0) for d in devices if isinstance(d, dict)]
    return sum(c for c in counts if isinstance(c, int))


def read_environment(
    environ: Mapping[str, str] | None = None,
    cli_args: Sequence[str] = (),
    sdk: SdkJob | None = None,
) -> Environment:
    """Snapshot the environment; raises ConfigError for a malformed config file. `sdk`: the
    SDK v3 job the hook handed over, whose own environment script is run here."""
    environ = dict(os.environ if environ is None else environ)
    base = base_dir_from(environ)
    sdk_env = sdk_driver.read_sdk_environment(base, sys.executable, environ) if sdk else {}
    smi = gpus.query_nvidia_smi()
    efa = read_efa_devices()
    ofi, fabric = read_efa_software() if efa else (None, None)
    config = base / "input" / "config"
    data = base / "input" / "data"
    cwd = os.getcwd()
    candidates = script_candidates(cwd, str(base / "code"), cli_args[0]) if cli_args else ()
    resource_config = _optional_json(config / "resourceconfig.json")
    instance_type = (resource_config or {}).get("current_instance_type", "local")
    return Environment(
        base_dir=base,
        environ=environ,
        resource_config=resource_config,
        hyperparameters=_optional_json(config / "hyperparameters.json") or {},
        input_data_config=_optional_json(config / "inputdataconfig.json") or {},
        nvidia_smi=smi.output,
        cpu_count=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else (os.cpu_count() or 1),
        hostname=socket.gethostname(),
        python=sys.executable,
        cwd=cwd,
        cli_args=tuple(cli_args),
        code_dir_entries=_entries(base / "code"),
        code_channel_entries=_entries(data / "code"),
        local_channels=tuple(name for name in _entries(data) if (data / name).is_dir()),
        efa_devices=efa,
        interfaces=_interfaces(),
        torch_version=_torch_version(),
        scripts_found=tuple(path for path in candidates if os.path.isfile(path)),
        arg_max=_arg_max(),
        nvidia_smi_error=smi.error,
        gpu_driver=gpus.read_driver(),
        physical_cores=read_physical_cores(),
        shm_bytes=shm.read_bytes(),
        nccl_conf=read_nccl_conf(),
        ofi_nccl_version=ofi,
        libfabric_version=fabric,
        kernel_release=os.uname().release,
        boot_id=read_boot_id(),
        sdk=sdk,
        sdk_env=sdk_env,
        all_cpus=os.cpu_count() or 1,
        neuron_cores=read_neuron_cores(instance_type),
        smddprun=shutil.which("smddprun") is not None,
        smddpmprun=shutil.which("smddpmprun") is not None,
    )
