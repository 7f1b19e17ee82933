"""What each check of the preflight (preflight.py) decides, and how a failed one is reported:
exact GPU arithmetic, bus bandwidth, whether NCCL uses EFA, the /dev/shm warning. Stdlib (and
torch, passed in or imported where a check needs it): this runs in each rank's own Python.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Mapping
from typing import Any

from container_entry.common import shm
from container_entry.common.exits import ExitCode
from container_entry.common.logs import PREFIX

# The exit code of a failed check (docs/failure-stop-logs.md, "Exit codes"): this host's GPUs are
# not usable as counted, or a peer never joined (the deadline); any other check FAILED.
EXIT_CODES: Mapping[str, ExitCode] = {
    "gpu-count": ExitCode.DEVICE,
    "gpu-matmul": ExitCode.DEVICE,
    "deadline": ExitCode.NETWORK,
}


class PreflightError(RuntimeError):
    def __init__(self, message: str, exit_code: int = ExitCode.FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def fail(check: str, host: str, detail: str) -> PreflightError:
    """The error of a failed check, naming the check and the host, with the check's exit code."""
    return PreflightError(
        f"preflight check '{check}' failed on host {host}: {detail}",
        EXIT_CODES.get(check, ExitCode.FAILED),
    )


def print_failure(error: BaseException) -> None:
    """The traceback on stderr, as the worker wrapper parses it into the rank's exception: its
    last line 'PreflightError: <message>', the class by its own name (not its module's)."""
    lines = traceback.format_exception(error)
    lines[-1] = f"{type(error).__name__}: {error}\n"
    sys.stderr.write("".join(lines))
    sys.stderr.flush()


def exact_operands(size: int, seed: int = 1234) -> tuple[Any, Any]:
    """Two matrices of -1/0/1: every product sums to an integer of at most `size`, exact in
    fp32, TF32 (fp32 accumulation) and, for size <= 256, in a bf16 result too."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    a = torch.randint(-1, 2, (size, size), generator=generator)
    b = torch.randint(-1, 2, (size, size), generator=generator)
    return a, b


def matmul_check(torch: Any, device: Any, local_rank: int, host: str) -> None:
    """This GPU multiplies small-integer matrices exactly: fp32 (TF32 if forced), then bf16."""
    a, b = exact_operands(1024)
    want = a @ b  # int64 on the CPU: exact
    got = (a.float().to(device) @ b.float().to(device)).cpu()
    if not torch.equal(got, want.float()):
        wrong = int((got != want.float()).sum())
        raise fail(
            "gpu-matmul", host, f"GPU {local_rank}: {wrong} of {want.numel()} fp32 products wrong"
        )
    if torch.cuda.is_bf16_supported():
        a, b = exact_operands(256, seed=99)
        want = (a @ b).float()
        got = (a.to(device, torch.bfloat16) @ b.to(device, torch.bfloat16)).float().cpu()
        if not torch.equal(got, want):
            wrong = int((got != want).sum())
            detail = f"GPU {local_rank}: {wrong} of {want.numel()} bf16 products wrong"
            raise fail("gpu-matmul", host, detail)


def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """all_reduce bus bandwidth in bytes/s (nccl-tests' convention: 2(n-1)/n of algbw)."""
    if seconds <= 0:
        return 0.0
    factor = 2 * (world - 1) / world if world > 1 else 1.0
    return nbytes / seconds * factor


_NETWORK = re.compile(r"NCCL INFO Using network (.+?)\s*$")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is (\w[\w-]*)")


def nccl_network(lines: list[str]) -> tuple[str | None, str | None]:
    """(network NCCL chose, OFI provider) from NCCL_DEBUG=INFO lines."""
    network = provider = None
    for line in lines:
        found = _NETWORK.search(line)
        if found:
            network = found.group(1)
        chosen = _PROVIDER.search(line)
        if chosen:
            provider = chosen.group(1)
    return network, provider


def ofi_problem(network: str | None, provider: str | None, devices: list[str]) -> str | None:
    """Why NCCL is not using EFA through aws-ofi-nccl; None when it is."""
    where = f"EFA devices {', '.join(devices)} are present"
    if network is None:
        return f"{where} but NCCL never said which network it uses (no 'Using network' line)"
    if "libfabric" not in network.lower():
        return (
            f"{where} but NCCL uses network '{network}', not aws-ofi-nccl ('Libfabric'): the "
            "plugin did not load (is /opt/amazon/ofi-nccl/lib on LD_LIBRARY_PATH?), so traffic "
            "between hosts goes over TCP sockets, about 10x slower"
        )
    if provider is not None and provider != "efa":
        return f"{where} but aws-ofi-nccl selected the libfabric provider '{provider}', not efa"
    return None


def shm_line(host: str, path: str = shm.PATH) -> str | None:
    """The plan's /dev/shm warning (container_entry.common.shm), printed by the preflight on each
    host."""
    warning = shm.warning(shm.read_bytes(path))
    return f"{PREFIX} preflight warning on {host}: {warning}" if warning else None
