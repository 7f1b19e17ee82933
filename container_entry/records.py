"""The records that cross process and host boundaries, typed once.

A `RankRecord` is written by each rank's worker wrapper when its script ends
(`<run dir>/rank-N.json`), read by the launcher's monitor, relayed to the other hosts when it is
the first failure, and turned into the failure file's lines. Stdlib only (the worker uses it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RankRecord:
    host: str | None
    rank: int | None  # None: not a rank's failure (the bootstrap's own, before any launch)
    local_rank: int | None = None
    returncode: int = 0
    restart_count: int = 0
    signal: str | None = None
    exception: dict[str, str] | None = None  # {"type", "message"}
    fatal_error: str | None = None  # faulthandler's "Fatal Python error: ..." line
    last_words: str | None = None  # the last stderr line of a failed script
    stop_signal: str | None = None  # a stop the wrapper saw before the script ended
    stop_requested_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    stderr_tail: list[str] = field(default_factory=list)
    log: str | None = None
    what: str | None = None  # a failure that is no rank's: what happened, in words
    stage: str | None = None  # "preflight": the preflight failed, the script never started
    # the failure file's words for it, as its own host put them (with what only that host's
    # rank log shows): every host writes the job's first failure in these same words
    summary: str | None = None
    log_error: str | None = None  # the rank log stopped (a full disk): where and why
    console_error: str | None = None  # the console stopped taking this rank's lines: why

    @property
    def failed(self) -> bool:
        return bool(self.returncode)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def relayed(self) -> dict[str, Any]:
        """What another host needs to name this failure (no logs, no tail)."""
        data = self.to_json()
        local = ("stderr_tail", "log", "started_at", "stop_requested_at")
        for name in (*local, "log_error", "console_error"):
            data.pop(name)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically: a reader never sees half a record. ASCII JSON (a name that is not UTF-8 is an
    escape in it, never an encoding error); a write that fails (a full disk) leaves nothing
    behind and raises OSError."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(data, indent=1, ensure_ascii=True), encoding="ascii")
        temporary.replace(path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
