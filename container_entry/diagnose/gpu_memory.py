"""Who holds the memory of the GPU a rank ran out of, from the driver, with processes named as
ranks: the usual answer to "why is GPU 0 out of memory when the others are not" is every other
rank's CUDA context on it (about 0.5 GiB each: a library touching CUDA before
`torch.cuda.set_device`, or `torch.load` without `map_location`; pytorch#135279).

Asked while the other ranks still run (their contexts vanish when they exit): `nvidia-smi`'s
compute-apps query, pids mapped to ranks through each rank's announced processes and their
descendants. A process that is no rank of this host is named as such (inside a container
without the host's PID namespace the driver may report pids the container cannot see).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from container_entry.common import offspring
from container_entry.common.records import WorkerPids
from container_entry.diagnose.culprit import ranges

QUERY_SECONDS = 10.0
_OOM_GPU = re.compile(r"GPU (\d+) has a total capacity")
_CONTEXT_NOTE = (
    "a CUDA context each made on GPU {gpu}, usually a library touching CUDA before "
    "torch.cuda.set_device, or torch.load without map_location"
)


@dataclass(frozen=True)
class Holder:
    pid: int
    mib: float
    rank: int | None  # None: not a rank of this host


def oom_device(message: str, visible: str | None = None) -> int | None:
    """The physical GPU index a CUDA OOM names ('GPU 0 has a total capacity' is the process's
    device ordinal: mapped through CUDA_VISIBLE_DEVICES when that is a list of indices)."""
    match = _OOM_GPU.search(message)
    if not match:
        return None
    ordinal = int(match.group(1))
    listed = [item.strip() for item in (visible or "").split(",") if item.strip()]
    if listed and all(item.isdigit() for item in listed) and ordinal < len(listed):
        return int(listed[ordinal])
    return ordinal


def _smi(args: list[str]) -> list[list[str]]:
    done = offspring.run(
        ["nvidia-smi", *args], capture_output=True, text=True, timeout=QUERY_SECONDS, check=True
    )
    return [[cell.strip() for cell in line.split(",")] for line in done.stdout.splitlines() if line]


def holders(gpu: int, ranks: Mapping[int, WorkerPids]) -> list[Holder]:
    """Every compute process on GPU `gpu` with its memory, largest first; raises OSError or
    subprocess.SubprocessError when the driver cannot be asked."""
    gpus = _smi(["--query-gpu=index,uuid", "--format=csv,noheader"])
    uuids = {row[1]: int(row[0]) for row in gpus if len(row) >= 2 and row[0].isdigit()}
    apps = _smi(["--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"])
    owner = _owners(ranks)
    found = []
    for pid, uuid, used in (row[:3] for row in apps if len(row) >= 3):
        if uuids.get(uuid) == gpu and pid.isdigit():
            mib = float(used) if used.replace(".", "", 1).isdigit() else 0.0
            found.append(Holder(int(pid), mib, owner.get(int(pid))))
    return sorted(found, key=lambda h: -h.mib)


def _owners(ranks: Mapping[int, WorkerPids]) -> dict[int, int]:
    """pid -> rank, for each rank's wrapper, script and the script's descendants."""
    owner: dict[int, int] = {}
    for rank, pids in ranks.items():
        stack = [pids.wrapper, pids.child]
        while stack:
            pid = stack.pop()
            if pid in owner:
                continue
            owner[pid] = rank
            for tasks in Path(f"/proc/{pid}/task").glob("*/children"):
                try:
                    stack += [int(child) for child in tasks.read_text().split()]
                except (OSError, ValueError):
                    continue
    return owner


def _gib(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB"


def report(gpu: int, host: str, failed: int, found: list[Holder]) -> str:
    """'CUDA out of memory on GPU 0 (algo-1): rank 0 holds 71.2 GiB; ranks 1-7 hold 3.6 GiB
    more on it (about 520 MiB each: ...)'."""
    text = f"CUDA out of memory on GPU {gpu} ({host})"
    own = sum(h.mib for h in found if h.rank == failed)
    others = [h for h in found if h.rank is not None and h.rank != failed]
    strangers = [h for h in found if h.rank is None]
    parts = [f"rank {failed} holds {_gib(own)}" if own else f"rank {failed} had exited"]
    if others:
        ranks = sorted({h.rank for h in others if h.rank is not None})
        total = sum(h.mib for h in others)
        each = total / len(ranks)
        verb = "holds" if len(ranks) == 1 else "hold"
        parts.append(
            f"{ranges(ranks)} {verb} {_gib(total)} more on it (about {each:.0f} MiB each: "
            f"{_CONTEXT_NOTE.format(gpu=gpu)})"
        )
    if strangers:
        pids = ", ".join(str(h.pid) for h in strangers[:5])
        total = sum(h.mib for h in strangers)
        parts.append(f"processes that are no rank of {host} (pid {pids}) hold {_gib(total)}")
    return f"{text}: " + "; ".join(parts)
