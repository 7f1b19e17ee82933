"""/dev/shm: the one home of the size below which it is too small, of how its size is read, and
of the advice when it is. Stdlib only: the preflight reads it in each rank too.

NCCL (between the GPUs of one host) and DataLoader workers keep data in /dev/shm; docker gives a
container 64 MiB unless told otherwise, and a rank that fills it dies with 'Bus error' or 'No
space left on device'. Why 1 GiB: docs/gpu.md, "Shared memory". The plan warns about a small one
(`warning`), the preflight prints the same on every host, and a rank that failed on it gets
`HINT` in the failure file.
"""

from __future__ import annotations

import os

PATH = "/dev/shm"
MIN_BYTES = 1 << 30  # below this, a warning
FIX = "--shm-size=1g (or more) or --ipc=host"
HINT = f"shared memory (/dev/shm) too small: run the container with {FIX}"


def read_bytes(path: str = PATH) -> int | None:
    """The size of the file system at `path`; None when it cannot be read."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_frsize * stat.f_blocks


def too_small(size: int | None) -> bool:
    """Whether a /dev/shm of `size` bytes is below MIN_BYTES (None: unknown, not too small)."""
    return size is not None and size < MIN_BYTES


def _mib(size: int) -> str:
    return f"{size / (1 << 30):.1f} GiB" if size >= 1 << 30 else f"{size // (1 << 20)} MiB"


def warning(size: int | None) -> str | None:
    """One line naming the size of /dev/shm and the fix, when it is too small."""
    if size is None or not too_small(size):
        return None
    return (
        f"/dev/shm is {_mib(size)}, below {_mib(MIN_BYTES)}: NCCL (between the GPUs of one host) "
        "and DataLoader workers keep data there and die with 'Bus error' or 'No space left on "
        f"device' when it fills; start the container with {FIX}"
    )
