"""The preflight's progress and deadline (preflight.py): each rank's stage, in the job's store for
the others, and the watchdog thread that fails the pass when the deadline passes, naming the
ranks (and hosts) furthest behind, never the healthy host that waited for them.

A rank still before `join` fires at the deadline, the others a grace period later, so the stuck
rank's own report comes first when it can still run Python. Stdlib only: this runs in each
rank's own Python.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from container_entry.rank.preflight_checks import EXIT_CODES, PreflightError, fail, print_failure

DEADLINE_ENV = "_CONTAINER_ENTRY_PREFLIGHT_DEADLINE"  # seconds; DEFAULT_DEADLINE otherwise
# Fault injection for the tests only: "RANK:STAGE" makes that rank hang at that stage,
# "RANK:STAGE:SECONDS" makes it that much slower there.
STALL_ENV = "_CONTAINER_ENTRY_PREFLIGHT_STALL"
DEFAULT_DEADLINE = 300.0
GRACE = 15.0  # ranks that already joined wait this much longer before reporting
STAGES = ("connect", "gpu-count", "gpu-matmul", "join", "all-reduce", "bandwidth", "done")
STAGE_KEY = "stage/"  # under the preflight's own store prefix


def laggards(stages: Mapping[int, dict[str, Any] | None], now: float) -> tuple[str, str]:
    """(host of the first rank furthest behind, one line naming every such rank), from each
    rank's last stage record ({"stage", "host", "local", "at"}; None: never reported)."""

    def position(record: dict[str, Any] | None) -> int:
        return -1 if record is None else STAGES.index(record.get("stage", "connect"))

    lowest = min(position(record) for record in stages.values())
    behind = sorted(rank for rank, record in stages.items() if position(record) == lowest)
    ahead = len(stages) - len(behind)
    names = []
    longest = 0.0
    for rank in behind[:8]:
        record = stages[rank]
        if record is None:
            names.append(f"rank {rank}")
        else:
            longest = max(longest, now - float(record.get("at", now)))
            names.append(f"rank {rank} (local {record.get('local')}) on {record.get('host')}")
    more = f" and {len(behind) - 8} more" if len(behind) > 8 else ""
    where = "never reported" if lowest < 0 else f"still in '{STAGES[lowest]}'"
    if longest >= 1:
        where += f" (for {longest:.0f} s)"
    first = stages[behind[0]]
    host = first.get("host", "?") if first else "?"
    text = f"{', '.join(names)}{more} {where}"
    if ahead:
        text += f"; {ahead} other rank(s) got further and waited for it"
    return str(host), text


def stage_seconds(marks: list[tuple[str, float]], end: float) -> str:
    """Where the pass spent its time, from (stage, monotonic time entered) marks: the first
    mark is the process's start; each stage lasts until the next mark (the last until `end`).
    "in 1.93 s: import 1.21 s, connect 0.05 s, ..." (stages under 5 ms left out)."""
    parts = []
    for (stage, at), (_, until) in zip(marks, [*marks[1:], ("", end)], strict=True):
        if until - at >= 0.005:
            parts.append(f"{stage} {until - at:.2f} s")
    total = end - marks[0][1] if marks else 0.0
    return f"in {total:.2f} s" + (f": {', '.join(parts)}" if parts else "")


class Progress:
    """This rank's stage, in the store for the others, and the watchdog that enforces the
    deadline."""

    def __init__(self, rank: int, local_rank: int, host: str, deadline: float) -> None:
        self.rank, self.local_rank, self.host = rank, local_rank, host
        self.started = time.monotonic()
        self.marks: list[tuple[str, float]] = [("import", self.started)]  # Python and torch
        self.deadline = deadline
        self.stage = "connect"
        self.store: Any = None
        self.world = 1
        self.stall = os.environ.get(STALL_ENV, "")

    def timeout(self) -> float:
        """For torch's own waits: past our deadline and grace, so the watchdog speaks first."""
        return max(1.0, self.deadline - (time.monotonic() - self.started)) + 2 * GRACE

    def enter(self, stage: str) -> None:
        self.stage = stage
        if self.marks[-1][0] != stage:
            self.marks.append((stage, time.monotonic()))
        if self.store is not None:
            record = {"stage": stage, "host": self.host, "local": self.local_rank}
            self.store.set(STAGE_KEY + str(self.rank), json.dumps({**record, "at": time.time()}))
        stall = self.stall.split(":")
        if stall[:2] == [str(self.rank), stage]:  # fault injection (tests only)
            if len(stall) > 2:  # slow here
                time.sleep(float(stall[2]))
                return
            while True:  # stuck here
                time.sleep(3600)

    def stages(self) -> dict[int, dict[str, Any] | None]:
        found: dict[int, dict[str, Any] | None] = {}
        for rank in range(self.world):
            key = STAGE_KEY + str(rank)
            found[rank] = json.loads(self.store.get(key)) if self.store.check([key]) else None
        return found

    def report(self) -> str:
        """The failure line when the deadline passed."""
        waited = time.monotonic() - self.started
        if self.store is None:
            return str(
                fail(
                    "deadline",
                    self.host,
                    f"rank {self.rank} (local {self.local_rank}) did not reach the job's store "
                    f"within {waited:.0f} s (importing torch, or the master host unreachable)",
                )
            )
        try:
            host, text = laggards(self.stages(), time.time())
            return str(fail("deadline", host, f"no progress within {waited:.0f} s: {text}"))
        except Exception as error:  # the store itself is gone: say what we know
            return str(
                fail(
                    "deadline",
                    self.host,
                    f"rank {self.rank} still in '{self.stage}' after {waited:.0f} s (the other "
                    f"ranks' progress could not be read: {type(error).__name__}: {error})",
                )
            )

    def watch(self, exit: Callable[[int], None] = os._exit) -> threading.Thread:
        """Start the watchdog: at the deadline (a grace period later for ranks that joined) it
        prints the report as a PreflightError's traceback and ends the process."""

        def run() -> None:
            while True:
                behind = STAGES.index(self.stage) < STAGES.index("join")
                limit = self.deadline + (0.0 if behind else GRACE)
                left = limit - (time.monotonic() - self.started)
                if self.stage == "done":
                    return
                if left <= 0:
                    break
                time.sleep(min(left, 1.0))
            try:
                raise PreflightError(self.report())
            except PreflightError as error:
                print_failure(error)
            exit(EXIT_CODES["deadline"])

        thread = threading.Thread(target=run, name="preflight-deadline", daemon=True)
        thread.start()
        return thread
