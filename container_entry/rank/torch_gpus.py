"""What torch in the job's Python sees of the GPUs, against what the bootstrap counted (gpus.py).

`check_visible_gpus` runs this file as a program (`python torch_gpus.py`) in the job's Python,
with the workers' environment: `main` imports torch, counts the devices without creating a CUDA
context, and prints one JSON line (torch and CUDA versions, the count, device names, the
driver's version, what torch warned). `describe_probe` turns that line into one sentence when
the count differs. As a program it imports the stdlib and torch only, and nothing from the
folder it lies in.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Mapping
from typing import Any

PROGRAM = os.path.abspath(__file__)
GPU_CHECK_TIMEOUT = 120.0
_DRIVER = re.compile(r"Kernel Module\s+(\S+)")


def probe() -> dict[str, Any]:
    """torch's view of the GPUs in this process, as one JSON object."""
    try:
        import torch
    except Exception as error:
        return {"error": f"import torch failed: {type(error).__name__}: {error}"}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.cuda.is_available()
        count = torch.cuda.device_count() if available else 0
    found: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "count": count,
        "warnings": [str(w.message).strip() for w in caught],
    }
    with contextlib.suppress(Exception):
        found["driver_cuda"] = torch._C._cuda_getDriverVersion()
    try:
        found["names"] = [torch.cuda.get_device_name(i) for i in range(count)]
    except Exception as error:
        found["names_error"] = str(error)
    with contextlib.suppress(OSError), open("/proc/driver/nvidia/version") as handle:
        found["driver"] = handle.readline().strip()
    return found


def main() -> None:
    # run by path, Python puts this file's folder first on sys.path: its modules (network,
    # records, ...) must not stand in for any torch may import
    here = os.path.dirname(os.path.realpath(PROGRAM))
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != here]
    print(json.dumps(probe()))


def describe_probe(found: Mapping[str, Any], expected: int) -> str | None:
    """One line when torch's view (the probe's JSON) differs from the count; None when not."""
    if "error" in found:
        return f"the GPU check could not run: {found['error']}"
    count = int(found.get("count", 0))
    if count == expected:
        return None
    names = sorted(set(found.get("names") or []))
    seen = f"sees {count} GPU{'s' * (count != 1)}" + (f" ({', '.join(names)})" if names else "")
    driver = found.get("driver") or ""
    module = _DRIVER.search(driver)
    parts = [f"NVIDIA driver {module.group(1) if module else 'not found'}"]
    driver_cuda = found.get("driver_cuda")
    if isinstance(driver_cuda, int) and driver_cuda > 0:
        parts[0] += f" (supports CUDA {driver_cuda // 1000}.{driver_cuda % 1000 // 10})"
    parts.append(f"CUDA runtime {found.get('cuda') or 'none (a CPU build of torch)'}")
    line = (
        f"torch {found.get('torch')} {seen}, but {expected} GPU{'s' * (expected != 1)} were "
        f"counted; {', '.join(parts)}"
    )
    said = [w for w in found.get("warnings") or [] if w]
    if said:
        line += f"; torch said: {said[0].splitlines()[0][:300]}"
    return line


def check_visible_gpus(
    python: str, expected: int, env: Mapping[str, str], timeout: float = GPU_CHECK_TIMEOUT
) -> str | None:
    """Ask the job's Python, in a subprocess with the workers' environment, how many GPUs torch
    sees (no CUDA context is created). None when that is `expected`, else one line naming the
    mismatch with the driver and CUDA runtime versions."""
    if expected <= 0:
        return None
    from container_entry.common import (
        offspring,  # as a program this file imports stdlib and torch only
    )

    try:
        done = offspring.run(
            [python, PROGRAM],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return (
            f"the GPU check ({python}: import torch, count devices) did not answer within "
            f"{timeout:g} s"
        )
    except OSError as error:
        return f"the GPU check could not start {python}: {error.strerror or error}"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        return f"the GPU check ({python}) failed with exit code {done.returncode}: {tail}"
    return describe_probe(json.loads(lines[-1]), expected)


if __name__ == "__main__":
    main()
