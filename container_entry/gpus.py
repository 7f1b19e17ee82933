"""Where GPUs are counted, without initialising CUDA in the bootstrap.

Initialising CUDA in the parent before torchrun forks workers wastes memory on GPU 0 and can
break fork-based workers, so we count from the environment and `nvidia-smi -L` instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

_NO_DEVICES = {"", "void", "none", "-1"}
_GPU_LINE = re.compile(r"^GPU \d+:")


@dataclass(frozen=True)
class GpuCount:
    count: int
    source: str  # why we believe it, shown in the plan


def parse_nvidia_smi(output: str) -> int:
    """Count physical GPUs in `nvidia-smi -L` output (MIG child lines are indented, not counted)."""
    return sum(1 for line in output.splitlines() if _GPU_LINE.match(line))


def _listed(value: str) -> int | None:
    """Devices named by a *_VISIBLE_DEVICES value; None means 'all' (not a restriction)."""
    value = value.strip()
    if value.lower() in _NO_DEVICES:
        return 0
    if value.lower() == "all":
        return None
    return len([item for item in value.split(",") if item.strip()])


def count_gpus(environ: Mapping[str, str], nvidia_smi_output: str | None) -> GpuCount:
    """Decide how many GPUs the workers will see.

    CUDA_VISIBLE_DEVICES restricts what CUDA shows, NVIDIA_VISIBLE_DEVICES what the container
    runtime mapped in; nvidia-smi tells what is physically there. The smallest known bound wins.
    """
    if nvidia_smi_output is None:
        # No driver tool, no GPU: a leftover CUDA_VISIBLE_DEVICES does not make one appear.
        return GpuCount(0, "no nvidia-smi")
    bounds = [(parse_nvidia_smi(nvidia_smi_output), "nvidia-smi -L")]
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        listed = _listed(environ[name]) if name in environ else None
        if listed is not None:
            bounds.append((listed, name))
    count, source = min(bounds, key=lambda bound: bound[0])
    return GpuCount(count, source)


def query_nvidia_smi(timeout: float = 30.0) -> str | None:
    """Run `nvidia-smi -L`; None when it is absent or fails (a CPU host)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        result = subprocess.run(
            [binary, "-L"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout if result.returncode == 0 else None
