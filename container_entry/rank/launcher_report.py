"""Which worker failed, as an entry point's own launcher reports it (the entry point that runs once
per host, launching its workers itself), and what that worker died of.

torchrun (and `accelerate launch`, and `torch.distributed.launch`, which run its agent) ends
with its own `ChildFailedError` traceback and a "Root Cause (first observed failure)" block
naming the rank, its local rank, host and exit code; `torch.multiprocessing.spawn` raises
`ProcessRaisedException` ("-- Process 1 terminated with the following error:" and that
process's own traceback) or `ProcessExitedException` ("process 1 terminated with exit code 3").
The last traceback of the output is then the launcher's, not the worker's: the worker's
exception is the last one of another type. Stdlib only (the rank's wrapper imports it).
"""

from __future__ import annotations

import re

from container_entry.common.exits import signal_name
from container_entry.common.records import PEER_GONE
from container_entry.common.text import TRACEBACK
from container_entry.rank.rank_end import parse_exception

# the exceptions launchers raise about their workers, not what any worker died of
LAUNCHER_ERRORS = frozenset(
    {
        "ChildFailedError",
        "ProcessRaisedException",
        "ProcessExitedException",
        "CalledProcessError",
        "SignalException",
    }
)
# what launchers put before a worker's lines: torch's excepthook (`[rank1]: `), and the log
# line head with which torch's elastic agent prints a function worker's traceback
_PREFIX = re.compile(r"^(\[rank\d+\]: |[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] )")
_ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(rank|exitcode|host)\s*:\s*(.*)$")
_RANK = re.compile(r"^(\d+) \(local_rank: (\d+)\)")
_CODE = re.compile(r"^(-?\d+)")
_RAISED = re.compile(r"^-- Process (\d+) terminated with the following error:")
_EXITED = re.compile(r"process (\d+) terminated with (exit code (-?\d+)|signal (\w+))")


def _torchrun_root_cause(lines: list[str]) -> tuple[str, str] | None:
    """The first observed failure of torchrun's report, in words, and its global rank. (Its
    host is the machine's own name, not the job's host name: left out.)"""
    starts = [i for i, line in enumerate(lines) if line.strip() == _ROOT_CAUSE]
    if not starts:
        return None
    fields: dict[str, str] = {}
    for line in lines[starts[-1] + 1 : starts[-1] + 12]:
        match = _FIELD.match(line)
        if match:
            fields.setdefault(match.group(1), match.group(2).strip())
    rank, code = _RANK.match(fields.get("rank", "")), _CODE.match(fields.get("exitcode", ""))
    if rank is None:
        return None
    words = f"worker rank {rank.group(1)} (local {rank.group(2)})"
    if code is not None:
        number = int(code.group(1))
        words += f": {f'signal {signal_name(-number)}' if number < 0 else f'exit code {number}'}"
    return words, rank.group(1)


def _spawned(lines: list[str]) -> str | None:
    """The process torch.multiprocessing.spawn names, in words."""
    for line in reversed(lines):
        raised = _RAISED.match(line.strip())
        if raised:
            return f"process {raised.group(1)} of torch.multiprocessing.spawn"
        exited = _EXITED.search(line)
        if exited and "Exception" in line:
            how = f"exit code {exited.group(3)}" if exited.group(3) else f"signal {exited.group(4)}"
            return f"process {exited.group(1)} of torch.multiprocessing.spawn: {how}"
    return None


def _worker_exception(lines: list[str], rank: str | None) -> dict[str, str] | None:
    """The exception of worker `rank` where torch tagged its lines (`[rank1]: `, torch's
    excepthook), else the last one in the output that is no launcher's about its workers, one
    that names no broken connection (a consequence) before one that does."""
    tag = f"[rank{rank}]: "
    own = [line[len(tag) :] for line in lines if rank is not None and line.startswith(tag)]
    found = parse_exception(own) if own else None
    if found:
        return found
    plain = [_PREFIX.sub("", line) for line in lines]
    headers = [i for i, line in enumerate(plain) if line.startswith(TRACEBACK)]
    ends = [*headers[1:], len(plain)][: len(headers)]
    candidates = [
        parse_exception(plain[start:end]) for start, end in zip(headers, ends, strict=True)
    ]
    workers = [c for c in candidates if c and c["type"].rsplit(".", 1)[-1] not in LAUNCHER_ERRORS]
    causes = [c for c in workers if not any(w in c.get("message", "") for w in PEER_GONE)]
    chosen = causes or workers
    return chosen[-1] if chosen else None


def worker_failure(lines: list[str]) -> tuple[str | None, dict[str, str] | None]:
    """(which worker failed, in words; its exception) from a launcher's output, each None where
    the output does not say."""
    root = _torchrun_root_cause(lines)
    if root is not None:
        return root[0], _worker_exception(lines, root[1])
    return _spawned(lines), _worker_exception(lines, None)
