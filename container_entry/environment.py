"""Read where we are (SageMaker's /opt/ml files, env vars, GPUs) into one frozen object.

This is the only place that reads the outside world for planning; everything downstream of
`Environment` is pure and unit-tested from hand-built instances.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from container_entry import gpus
from container_entry.errors import ConfigError

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

    @property
    def config_dir(self) -> Path:
        return self.base_dir / "input" / "config"


def base_dir_from(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("SAGEMAKER_BASE_DIR") or DEFAULT_BASE_DIR)


def read_json(path: Path, *, expect: type = dict) -> Any:
    """Load a config file; any problem becomes one line naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"{path}: cannot read ({error.strerror})") from None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ConfigError(f"{path}: malformed JSON ({error})") from None
    if not isinstance(value, expect):
        raise ConfigError(f"{path}: expected a JSON {expect.__name__}, got {type(value).__name__}")
    return value


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
    """EFA from the machine itself (devices bound to the `efa` driver), not an instance list."""
    devices = []
    for device in _entries(sys_root / "class" / "infiniband"):
        driver = sys_root / "class" / "infiniband" / device / "device" / "driver"
        try:
            if os.path.basename(os.readlink(driver)) == "efa":
                devices.append(device)
        except OSError:
            continue
    return tuple(devices)


def read_environment(
    environ: Mapping[str, str] | None = None, cli_args: Sequence[str] = ()
) -> Environment:
    """Snapshot the environment; raises ConfigError for a malformed config file."""
    environ = dict(os.environ if environ is None else environ)
    base = base_dir_from(environ)
    config = base / "input" / "config"
    data = base / "input" / "data"
    return Environment(
        base_dir=base,
        environ=environ,
        resource_config=_optional_json(config / "resourceconfig.json"),
        hyperparameters=_optional_json(config / "hyperparameters.json") or {},
        input_data_config=_optional_json(config / "inputdataconfig.json") or {},
        nvidia_smi=gpus.query_nvidia_smi(),
        cpu_count=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else (os.cpu_count() or 1),
        hostname=socket.gethostname(),
        python=sys.executable,
        cwd=os.getcwd(),
        cli_args=tuple(cli_args),
        code_dir_entries=_entries(base / "code"),
        code_channel_entries=_entries(data / "code"),
        local_channels=tuple(name for name in _entries(data) if (data / name).is_dir()),
        efa_devices=read_efa_devices(),
        interfaces=_interfaces(),
    )
