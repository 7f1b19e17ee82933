"""`container-entry stacks`: every live local rank's Python stacks, without stopping anything.

Run inside a running container (`docker exec CONTAINER container-entry stacks`, or an SSM
session into a SageMaker job). It finds the running launches through their private control
folders, asks each rank for its stacks (SIGUSR2: faulthandler, registered in the rank's own
Python by _site/sitecustomize.py, writes every thread's stack and the rank carries on), and
prints what each rank wrote, tagged by rank, with the file where the same text is kept.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from container_entry.common.exits import ExitCode
from container_entry.common.layout import CONTROL_ROOT, ControlDir, RunDir
from container_entry.common.records import Command
from container_entry.common.workers import Workers

# A rank writes its stacks the moment it is scheduled (faulthandler's handler is C, and runs in
# native code too): a rank on a CPU its DataLoader workers saturate can take seconds to be;
# one that never answers is stopped or stuck in the kernel. The wait ends once all answered.
WAIT_SECONDS = 10.0
SETTLED_SECONDS = 0.2  # a stack file that stopped growing this long is a whole dump


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launches(root: Path = CONTROL_ROOT) -> list[tuple[ControlDir, RunDir]]:
    """(control folder, run folder) of every launch whose bootstrap is still running."""
    found = []
    for pid, control in ControlDir.live(root):
        if not _alive(pid):
            continue
        try:
            found.append((control, RunDir(Path(Command.read(control.command).run_dir))))
        except (OSError, ValueError):
            continue
    return found


def print_live_stacks(root: Path = CONTROL_ROOT) -> int:
    found = launches(root)
    if not found:
        print("container-entry stacks: no running job in this container", file=sys.stderr)
        return ExitCode.FAILED
    for control, run_dir in found:
        _print_launch(Workers(control), run_dir)
    return ExitCode.SUCCESS


def _print_launch(found: Workers, run_dir: RunDir) -> None:
    workers = found.refresh()
    before: dict[int, tuple[Path, int]] = {}
    for rank in sorted(workers):
        path = run_dir.stack(rank)
        before[rank] = (path, path.stat().st_size if path.exists() else 0)
    asked = found.request_stacks()
    for rank in sorted(rank for rank, yes in asked.items() if not yes):
        print(
            f"rank {rank}: not asked (no stack handler in its process: not a Python script, "
            "or still starting)"
        )
    deadline = time.monotonic() + WAIT_SECONDS
    pending = {rank: before[rank] for rank, yes in asked.items() if yes and rank in before}
    growing: dict[int, tuple[int, float]] = {}  # rank: (size seen, since when)
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank, (path, size) in list(pending.items()):
            now = path.stat().st_size if path.exists() else size
            if now <= size:
                continue
            seen, since = growing.get(rank, (-1, 0.0))
            if now != seen:  # still being written (a handler the scheduler paused mid-dump)
                growing[rank] = (now, time.monotonic())
                continue
            if time.monotonic() - since >= SETTLED_SECONDS:
                text = path.read_bytes()[size:now].decode("utf-8", "replace")
                host = workers[rank].host or "?"
                for line in text.rstrip("\n").splitlines():
                    print(f"[{host} rank {rank}] {line}")
                print(f"[{host} rank {rank}] (also in {path})", flush=True)
                del pending[rank]
    for rank in sorted(pending):
        print(f"rank {rank}: no stacks within {WAIT_SECONDS:g} s (stopped, or stuck in the kernel)")
