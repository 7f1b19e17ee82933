"""Read where we are (SageMaker's /opt/ml files, env vars, GPUs) into one frozen object.

This is the only place that reads the outside world for planning; everything downstream of
`Environment` is pure and unit-tested from hand-built instances.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import shutil
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container_entry.common import shm
from container_entry.common.errors import ConfigError
from container_entry.plan import gpus, sdk_driver
from container_entry.plan.launchers import MAX_BYTES
from container_entry.plan.machine import (
    read_boot_id,
    read_efa_devices,
    read_efa_software,
    read_nccl_conf,
    read_neuron_cores,
    read_physical_cores,
)
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
    # --- the code, once it is where it runs (read_code_files): whether it launches workers ---
    code_files: Mapping[str, bytes] | None = None  # None: not read yet (it may come from S3)
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


def read_config(path: Path) -> Any:
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
    return read_config(path) if path.exists() else None


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


CODE_FILES = 400  # scripts read at most (a big repository's own code folder): 100 MiB at most
CODE_ENTRIES = 5000  # names looked at at most: a code folder may be `/` (`train /train.py`)
CODE_DEPTH = 3  # folders below the code folder
_SKIPPED = ("__pycache__", "site-packages", "node_modules", "proc", "sys", "dev")


def _is_script(path: Path) -> bool:
    if path.suffix in (".py", ".sh", ".bash"):
        return True
    if path.suffix:
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"#!"
    except OSError:
        return False


def _scripts(root: Path) -> list[Path]:
    """The scripts under `root`, breadth first, within the bounds above."""
    found: list[Path] = []
    seen = 0
    for folder, names, entries in os.walk(root):
        depth = len(Path(folder).relative_to(root).parts)
        keep = [n for n in names if not n.startswith(".") and n not in _SKIPPED]
        names[:] = [] if depth >= CODE_DEPTH else sorted(keep)
        for name in sorted(entries):
            seen += 1
            path = Path(folder, name)
            if seen > CODE_ENTRIES or len(found) >= CODE_FILES:
                return found
            if path.is_file() and _is_script(path):
                found.append(path)
        seen += len(names)
    return found


def read_code_files(code_dir: str, script: str) -> dict[str, bytes]:
    """The code folder's scripts (.py, .sh, and files with a '#!' line, a few folders deep,
    each up to MAX_BYTES), keyed by their path relative to it, and the entry script
    under `code_key(code_dir, script)`: what the launch mode is decided from (launchers.py).
    What cannot be read is left out; nothing here fails."""
    files: dict[str, bytes] = {}
    root = Path(code_dir)
    key = code_key(code_dir, script)
    for path in [Path(script), *_scripts(root)]:
        name = key if path == Path(script) else str(path.relative_to(root))
        if name not in files and path.is_file():  # never a FIFO's open that blocks
            with contextlib.suppress(OSError), path.open("rb") as handle:
                files[name] = handle.read(MAX_BYTES)
    return files


def code_key(code_dir: str, script: str) -> str:
    """The entry script's name among `read_code_files`' keys."""
    relative = posixpath.relpath(script, code_dir)
    return script if relative.startswith("..") else relative


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
