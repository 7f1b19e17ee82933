"""The straggler watch while a multi-rank job trains (docs/stragglers.md): every
STRAGGLER_INTERVAL each host asks its ranks for their flight-recorder records
(flight_recorder.collect, the hang report's path), keeps of each only the entry times of its
newest collectives (arrivals.summarize) and sends them to the master, which puts them on its
clock, lines every group's collectives up across ranks and hosts (stragglers.analyse) and says
who is consistently the last to arrive, in one line per group, when that changes. The master
keeps the last table in the run folder (stragglers.json: `container-entry stragglers` prints
it) and names, at the job's end, a straggler that cost the others more than a few percent.

The decisions are the pure modules'; this is the effectful shell around them, in a thread of its
own: it never touches the ranks but through their dump thread, and never fails the job.
Samples are taken at the same moments on every host (multiples of the interval on the clock),
so every host's window of collectives covers the same steps.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import Any

from container_entry.common.exits import ExitCode
from container_entry.common.layout import ControlDir, RunDir
from container_entry.common.logs import log
from container_entry.common.workers import Workers
from container_entry.diagnose import flight_recorder
from container_entry.diagnose.stacks import launches
from container_entry.diagnose.stragglers import (
    RANK_BUDGET,
    GroupTable,
    RankArrivals,
    Table,
    analyse,
    encoded,
    merge,
    named,
    shown,
    straggler_line,
    summarize,
    who,
)
from container_entry.hosts.session import Session
from container_entry.hosts.wire import LINE_LIMIT

GATHER_SECONDS = 10.0  # the master's wait for the other hosts' summaries of one moment
ENVELOPE = 1024  # bytes of a host's `arrivals` line beside its ranks' summaries
FR_SIZES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def off_because(effective: dict[str, str | None]) -> str | None:
    """Why the ranks record nothing to line up (a user's TORCH_FR_BUFFER_SIZE=0), else None."""
    for name in FR_SIZES:
        value = effective.get(name)
        if value is not None and value.strip() == "0":
            return f"{name}=0 (the ranks record no collectives)"
    return None


def next_moment(now: float, interval: float) -> float:
    """The next multiple of `interval` on the clock: the same moment on every host."""
    return (math.floor(now / interval) + 1) * interval


class StragglerWatch:
    """One host's part: sample, summarise, send (or, on the master, line up and report)."""

    def __init__(
        self,
        interval: float,
        host: str,
        gpus: bool,
        control: ControlDir,
        run_dir: RunDir,
        session: Session,
        peers: frozenset[str] = frozenset(),
    ) -> None:
        self.interval = interval
        self.host = host
        self.peers = peers  # the other hosts of this world: the master waits for theirs
        self.gpus = gpus
        self.control = control
        self.run_dir = run_dir
        self.session = session
        self.workers = Workers(control)
        self.since: dict[int, dict[str, int]] = {}  # per rank: the newest sequence sent
        self.held: dict[int, RankArrivals] = {}  # the master's, per rank, on its clock
        self.through: dict[str, int] = {}  # per group: the newest collective analysed
        self.latest: dict[str, GroupTable] = {}  # per group: its last analysed figures
        self.named: dict[str, str] = {}  # per group: its straggler line, latest figures
        self.subjects: dict[str, tuple[Any, ...] | None] = {}  # per group: whom it last named
        self._closed = threading.Event()
        self._busy = threading.Lock()  # held while a sample runs
        self._failed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="stragglers")

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """No sample from now on; one under way is waited for (its dumps are no hang's)."""
        self._closed.set()
        with self._busy:
            pass

    def finish(self) -> None:
        """At the job's end: the master names a straggler that cost the job more than a few
        percent of its time."""
        self.close()
        for line in self.named.values():  # each group's line on its latest figures
            if line:
                log(f"straggler summary: {line.removeprefix('straggler: ')}")

    def _loop(self) -> None:
        due = next_moment(time.time() + self.interval, self.interval)
        while not self._closed.wait(max(0.0, due - time.time())):
            with self._busy:
                if self._closed.is_set():
                    return
                try:
                    self.sample()
                except Exception as error:  # a sample never fails the job
                    if not self._failed:
                        log(f"straggler sample failed: {type(error).__name__}: {error}")
                    self._failed = True
            due = next_moment(time.time(), self.interval)

    def sample(self) -> None:
        """This host's ranks' newest collectives: to the master, or lined up here."""
        pids = self.workers.refresh()
        landed = flight_recorder.collect(self.control, self.run_dir, sorted(pids))
        budget = min(RANK_BUDGET, (LINE_LIMIT - ENVELOPE) // max(1, len(landed)))
        summaries = []
        for rank, path in sorted(landed.items()):
            dump = _read(path, remove=path == self.run_dir.dump(rank))
            if dump is None:
                continue
            local = pids[rank].local_rank if rank in pids else 0
            gpu = local if self.gpus else None
            since = self.since.get(rank)
            summary = summarize(rank, local, self.host, dump, since, gpu=gpu, budget=budget)
            self.since[rank] = {**(since or {}), **summary.newest()}
            summaries.append(summary)
        if self.session.analyses:
            self.conclude([*summaries, *self._gathered()])
        elif sent := _fitted(summaries):
            self.session.post_arrivals(sent)

    def _gathered(self) -> list[RankArrivals]:
        """The other hosts' summaries of this moment: they sample at it too, and send theirs
        once their ranks answered (bounded: a host that sends nothing is not waited for)."""
        arrived: list[RankArrivals] = []
        deadline = time.monotonic() + min(self.interval / 2, GATHER_SECONDS)
        while True:
            arrived += self.session.take_arrivals()
            heard = {summary.host for summary in arrived}
            if self.peers <= heard or time.monotonic() >= deadline or self._closed.is_set():
                return arrived
            time.sleep(0.05)

    def conclude(self, arrived: list[RankArrivals]) -> None:
        """The master: every rank's newest collectives lined up; a change of straggler said."""
        for summary in arrived:
            self.held[summary.rank] = merge(self.held.get(summary.rank), summary)
            for sent in summary.groups:  # made anew (a restart): counted from 1 again
                if sent.seqs and sent.seqs[-1] < self.through.get(sent.name, 0):
                    self.through[sent.name] = 0
        table = analyse(list(self.held.values()), after=self.through)
        for group in table.groups:
            if not group.ranks:  # too few new collectives lined up: nothing to say yet
                continue
            self.through[group.name] = group.through
            self.latest[group.name] = group
            found = named(Table((group,)))
            line = straggler_line(*found[0]) if found else ""
            subject = who(found[0][1]) if found else None
            if subject != self.subjects.get(group.name):  # said when whom it names changes
                log(line or f"straggler: none any more in group {group.name}")
                self.subjects[group.name] = subject
            self.named[group.name] = line  # its latest figures, for the table and the end
        if self.latest:
            self._write(Table(tuple(self.latest.values())))

    def _write(self, table: Table) -> None:
        data: dict[str, Any] = {
            "sampled_at": time.time(),
            "interval": self.interval,
            "lines": [line for line in self.named.values() if line],
            **table.to_json(),
        }
        path = self.run_dir.stragglers
        try:
            temporary = path.with_name(path.name + ".tmp")
            temporary.write_text(json.dumps(data, indent=1), encoding="utf-8")
            temporary.replace(path)
        except OSError as error:
            log(f"cannot write {path}: {error.strerror}")


def _fitted(summaries: list[RankArrivals]) -> list[RankArrivals]:
    """The summaries that say something, as many as one side-channel line holds (a host of
    hundreds of ranks: each is cut to its share already, the rest waits for the next moment)."""
    kept, size = [], ENVELOPE
    for summary in summaries:
        length = len(encoded(summary)) + 1  # and its comma: wire.encode is as compact
        if summary.groups and size + length <= LINE_LIMIT:
            kept.append(summary)
            size += length
    return kept


def _read(path: Path, *, remove: bool) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    if remove:  # a sample's dump is no hang's record (culprit.py reads the folder)
        path.unlink(missing_ok=True)
    return data if isinstance(data, dict) else None


def print_table() -> int:
    """`container-entry stragglers`: the master's last table of every running launch here."""
    found = launches()
    if not found:
        print("container-entry stragglers: no running job in this container", file=sys.stderr)
        return ExitCode.FAILED
    for _, run_dir in found:
        path = run_dir.stragglers
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            table = Table.from_json(data)
        except FileNotFoundError:
            print(
                f"no straggler table yet in {path}: the master host keeps it, from its first "
                "sample on (every CONTAINER_ENTRY_STRAGGLER_INTERVAL seconds; 0: off)"
            )
            continue
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"cannot read {path}: {error}")
            continue
        age = time.time() - float(data.get("sampled_at", 0))
        print(f"stragglers, sampled {age:.0f} s ago ({path}):")
        for line in [*shown(table), *data.get("lines", [])]:
            print(line)
    return ExitCode.SUCCESS
