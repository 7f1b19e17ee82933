"""What the machine itself says, for the plan: EFA devices and software, the cores under our CPUs,
NCCL's config file, the kernel's boot id, NeuronCores. Readers with injectable roots (the tests
use fake trees); environment.read_environment calls them once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from container_entry.common import offspring


def _entries(path: Path) -> tuple[str, ...]:
    try:
        return tuple(sorted(entry.name for entry in path.iterdir()))
    except OSError:
        return ()


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
