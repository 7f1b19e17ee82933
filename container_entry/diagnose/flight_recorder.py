"""Flight-recorder dumps of this host's ranks, asked for before a teardown (the hang watchdog).

Each rank's Python serves dumps from a thread (_site/sitecustomize.py) blocked on a FIFO of its
own in the launcher's control folder (layout.ControlDir.dump_request). Asking is one byte into
each FIFO; the rank writes its records to its dump file in the run folder (layout.RunDir.dump)
under a temporary name and renames it, so the launcher waits for the name alone (bounded: a rank
whose GIL never comes back does not hold up the teardown). The FIFOs live in the control folder,
removed with it when the launch ends.

torch's own pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) is not used: only ProcessGroupNCCL watches it,
it writes the dump in place with no sign of completion, and on an H200 (torch 2.11) no dump
existed after a hang that asked for one through it (docs/gpu.md). Stdlib only: the worker
wrapper imports it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable
from pathlib import Path

from container_entry.common.layout import ControlDir, RunDir

REQUEST_ENV = "_CONTAINER_ENTRY_DUMP_REQUEST"  # read (and removed) by _site/sitecustomize.py
FILE_ENV = "_CONTAINER_ENTRY_DUMP_FILE"
DEATH_FILE_ENV = "_CONTAINER_ENTRY_DEATH_DUMP_FILE"
WAIT_SECONDS = 5.0  # for every asked rank's dump to land


def listen(control: ControlDir, run: RunDir, rank: int) -> dict[str, str]:
    """The rank's FIFO and dump folder, made; the variables that hand them to its Python."""
    request = control.dump_request(rank)
    with contextlib.suppress(FileExistsError):
        os.mkfifo(request, 0o600)
    run.dumps.mkdir(parents=True, exist_ok=True)
    return {
        REQUEST_ENV: str(request),
        FILE_ENV: str(run.dump(rank)),
        DEATH_FILE_ENV: str(run.death_dump(rank)),
    }


def request(control: ControlDir, ranks: Iterable[int]) -> list[int]:
    """One byte to each rank's FIFO; the ranks that were listening."""
    asked = []
    for rank in ranks:
        try:  # ENXIO: no reader (not a Python rank, or it exited)
            fd = os.open(control.dump_request(rank), os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            os.write(fd, b"1")
            asked.append(rank)
        except OSError:
            pass
        finally:
            os.close(fd)
    return asked


def collect(
    control: ControlDir, run: RunDir, ranks: Iterable[int], timeout: float = WAIT_SECONDS
) -> dict[int, Path]:
    """Ask every rank for a dump and wait until each asked rank's file is complete (or the
    timeout); {rank: dump file} of those that landed. A dump lands as a new file (the rank
    writes it whole, then renames it into place), so one of an earlier request never passes
    for this one, and stays for a rank that can no longer answer (it died since).

    A rank whose script already ended, of an exception, answers with the dump of its death
    (`_death_dump`): in its exit its dump thread may never run again (Python's finalization
    holds daemon threads), while its FIFO still has a reader. Waiting the whole timeout for
    it held a host's records for 5 s, past the master's wait for them (a collective timeout
    on two hosts: both hosts' ranks died of it at once)."""
    ranks = list(ranks)
    before = {rank: _identity(run.dump(rank)) for rank in ranks}
    pending = {rank: run.dump(rank) for rank in request(control, ranks)}
    landed: dict[int, Path] = {}
    for rank in set(ranks) - set(pending):  # gone: its death's dump, if it wrote one
        if (death := _death_dump(control, run, rank)) is not None:
            landed[rank] = death
    deadline = time.monotonic() + timeout
    while pending:
        for rank, path in list(pending.items()):
            now = _identity(path)
            if now is not None and now != before[rank]:
                landed[rank] = pending.pop(rank)
            elif (death := _death_dump(control, run, rank)) is not None:
                landed[rank] = death
                del pending[rank]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return landed


def _death_dump(control: ControlDir, run: RunDir, rank: int) -> Path | None:
    """The dump the rank wrote as it died of an exception in this run of its script: written
    at exit after the script's end was noted (_site/sitecustomize.py: the end's mark first,
    then atexit's dump), so not older than the mark, which the wrapper removes before each
    start (one of an earlier attempt never passes for this one)."""
    ended, died = _identity(control.exiting(rank)), _identity(run.death_dump(rank))
    if ended is None or died is None or died[1] < ended[1]:
        return None
    return run.death_dump(rank)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns
