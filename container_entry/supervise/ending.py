"""How one host's run ends: one type, decided in one place, and the verdict it becomes. Pure.

`ending_of` looks at what the supervisor saw (`Seen`) and names the ending (`EndingKind`,
declared in priority order: where one look shows several, the first wins). The supervisor asks
it at every look until it names one, then tears the ranks down the way that ending needs
(teardown.py), and asks once more when torchrun exited on its own. `verdict` turns the ending
and what the run left (`Observed`) into the exit code and the failure file's lines.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

from container_entry.common.exits import ExitCode, of_returncode, stopped_exit_code
from container_entry.common.layout import RunDir
from container_entry.common.records import RankRecord
from container_entry.common.stopping import StopSignal
from container_entry.common.text import escaped
from container_entry.diagnose.failure import (
    describe_exit,
    describe_rank,
    hung_words,
    permanent,
    stack_lines,
    words,
)
from container_entry.diagnose.hang import is_hang
from container_entry.supervise.torchrun_output import USAGE_ERROR


class EndingKind(enum.Enum):
    """How a run ends, in priority order."""

    STOPPED = "stopped"  # SIGTERM, SIGINT or SIGHUP reached this host's bootstrap
    FAILED = "failed"  # a rank of this host failed, and a restart would not help
    LOST_MASTER = "lost master"  # the master's bootstrap went away
    HUNG = "hung"  # the hang watchdog: this host's, or the master's word for every host
    PEER_FAILED = "peer failed"  # another host failed first (the master's word)
    # another host was stopped first (the master's word): this host's ranks get the stop too,
    # with its grace, to checkpoint
    PEER_STOPPED = "peer stopped"
    TORCHRUN_FAILED = "torchrun failed"  # torchrun exited non-zero and no rank said why
    SUCCEEDED = "succeeded"


@dataclass(frozen=True)
class Seen:
    """What one look at the run shows: everything `ending_of` needs, nothing it must fetch."""

    stop: StopSignal | None = None  # this host's own
    failures: tuple[RankRecord, ...] = ()  # this host's ranks that failed on their own
    restarts: int = 0  # torchrun's --max-restarts: it restarts a failed group itself
    exited: bool = False  # torchrun exited: its restarts are over
    returncode: int | None = None  # torchrun's, once exited
    lost_master: str | None = None
    relayed: RankRecord | None = None  # the master's word: another host's failure, or a hang
    idle: float | None = None  # this host's ranks' silence (one host: its own watchdog)
    hang_timeout: float = 0.0
    host: str = ""


@dataclass(frozen=True)
class Ending:
    kind: EndingKind
    record: RankRecord | None = None  # the failure or hang verdict it names, if any
    master: str | None = None  # the lost master
    culprit: str | None = None  # a collective timed out: whom the ranks waited for (culprit.py)


def ending_of(seen: Seen) -> Ending | None:
    """The ending this look shows, the first kind in priority order; None: none yet."""
    if seen.stop is not None:
        return Ending(EndingKind.STOPPED)
    failures = seen.failures
    # a failure that would repeat identically is not worth a restart (failure.permanent)
    if failures and (seen.restarts == 0 or seen.exited or any(map(permanent, failures))):
        return Ending(EndingKind.FAILED, min(failures, key=lambda r: r.began or 0))
    if seen.lost_master is not None:
        return Ending(EndingKind.LOST_MASTER, master=seen.lost_master)
    if seen.relayed is not None and is_hang(seen.relayed):
        return Ending(EndingKind.HUNG, seen.relayed)
    if seen.hang_timeout and seen.idle is not None and seen.idle >= seen.hang_timeout:
        what = hung_words(seen.hang_timeout)
        record = RankRecord(host=seen.host, rank=None, returncode=ExitCode.HUNG, what=what)
        return Ending(EndingKind.HUNG, record)
    if seen.relayed is not None:
        kind = EndingKind.PEER_STOPPED if seen.relayed.host_stopped else EndingKind.PEER_FAILED
        return Ending(kind, seen.relayed)
    if not seen.exited:
        return None
    return Ending(EndingKind.TORCHRUN_FAILED if seen.returncode else EndingKind.SUCCEEDED)


@dataclass
class Observed:
    """What the run left, for the verdict's words."""

    torch_version: str | None = None
    returncode: int | None = None  # torchrun's
    results: dict[int, RankRecord] = field(default_factory=dict)
    launched: set[int] = field(default_factory=set)  # ranks whose wrapper announced itself
    # the stop this host's ranks got, from when: its own, or another host's as its word came
    stop: StopSignal | None = None
    torchrun_tail: list[str] = field(default_factory=list)
    forced_kill: bool = False  # ranks still running at the teardown's deadline were killed
    grace: float = 0.0  # the grace period that teardown gave
    restarts: int = 0  # torchrun's --max-restarts for this launch


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    reason: str  # the failure file's first line; empty on success
    details: list[str]


def verdict(ending: Ending, run: Observed, host: str, run_dir: RunDir) -> Verdict:
    """From the ending and what the run left to an exit code and a failure text."""
    logs = f"per-rank logs and records: {escaped(str(run_dir.path))}"
    failed = sorted((r for r in run.results.values() if r.failed), key=lambda r: r.rank or 0)
    details = [f"  {describe_rank(r)}" for r in failed] + stack_lines(run_dir) + [logs]
    kind, record = ending.kind, ending.record
    if kind in (EndingKind.STOPPED, EndingKind.PEER_STOPPED):  # torchrun's status says nothing here
        if finished_before_stop(run):
            return Verdict(ExitCode.SUCCESS, "", [])
        if kind is EndingKind.STOPPED or record is None:
            reason = f"{stopped_words(run.stop, host)}: {stopped_ranks(run)}"
        else:  # another host's, which this host's ranks got too
            reason = f"{words(record)}; on {host}: {stopped_ranks(run)}"
        came = run.stop or (record.stop if record is not None else None)  # before any launch
        return Verdict(came.exit_code if came else stopped_exit_code(None), reason, details)
    if kind is EndingKind.HUNG:  # first line exactly the verdict; then where each rank was
        assert record is not None
        return Verdict(ExitCode.HUNG, record.what or "hung", [*stack_lines(run_dir), logs])
    if kind in (EndingKind.FAILED, EndingKind.PEER_FAILED):
        assert record is not None
        code = of_returncode(record.returncode or ExitCode.FAILED)
        reason = f"{words(record, run.restarts)} [first failure]"
        if ending.culprit:  # the rank to blame first, the rank that timed out waiting after
            reason = f"collective timed out: {ending.culprit}; {reason}"
        return Verdict(code, reason, details)
    if kind is EndingKind.LOST_MASTER:
        text = (
            f"lost contact with the master host {ending.master} "
            f"(its bootstrap exited or the host died); {host} stopped"
        )
        return Verdict(ExitCode.FAILED, text, details)
    if kind is EndingKind.TORCHRUN_FAILED:
        code, reason = torchrun_failed(run, host)
        return Verdict(code, reason, details)
    return Verdict(ExitCode.SUCCESS, "", [])


def finished_before_stop(run: Observed) -> bool:
    """Every rank's script had ended before the stop came, and each rank exited with its own
    status 0 (SDK local mode stops the other containers as soon as one exits; torchrun may
    still sit at its exit barrier, a rank still in its exit): a success. A stop that reached a
    script still running is a stopped job, whatever the script then exited with."""
    ranks = [run.results.get(rank) for rank in run.launched]
    return bool(ranks) and all(
        r is not None
        and not r.failed
        and (r.script_ended_at or r.ended_at) is not None
        and (r.script_ended_at or r.ended_at or 0) <= (run.stop.at if run.stop else 0)
        for r in ranks
    )


def stop_cut_a_script(run: Observed, ended: Collection[int]) -> bool:
    """Whether a stop that just came reached a script still running, as far as the moment
    shows: no rank announced itself yet, or a launched rank has neither a record nor noted its
    script's end (`ended`: the ranks whose script did, sitecustomize's mark). Then the other
    hosts hear of the stop at once, before its ranks go, whose leaving breaks the other hosts'
    connections: their ranks' errors about that are its consequences, and the stop, told
    first and with its moment, is the job's first failure on every host. When every script
    had ended, the verdict may still be a success (`finished_before_stop`), told at the end."""
    if not run.launched:
        return True
    return any(rank not in run.results and rank not in ended for rank in run.launched)


def stopped_words(stop: StopSignal | None, host: str) -> str:
    """A stop in words that name the host it reached, for every host's first line."""
    return (
        f"job stopped by {stop.name if stop else None} on {host} (StopTrainingJob, Spot "
        "interruption or docker stop)"
    )


def stopped_ranks(run: Observed) -> str:
    """How many ranks exited in time after a stop, and which were still running and killed."""
    stop_at = run.stop.at if run.stop else 0.0
    exited = [r for r in run.results.values() if r.ended_at and stop_at]
    slowest = max((max(0.0, (r.ended_at or 0) - stop_at) for r in exited), default=0.0)
    killed = sorted(run.launched - set(run.results))
    total = len(run.launched) or len(exited)
    in_time = f"{len(exited)} of {total} local ranks exited within {slowest:.1f} s"
    if killed:
        ranks = ", ".join(map(str, killed))
        were = "were" if len(killed) > 1 else "was"
        then = f"{in_time}; " if exited else ""
        return (
            f"{then}rank{'s' if len(killed) > 1 else ''} {ranks} still running after the "
            f"{run.grace:g} s grace period {were} killed"
        )
    if run.forced_kill:
        return f"the {run.grace:g} s grace period ran out and the rest was killed"
    if not run.launched and not run.results:  # no rank announced itself or left a record
        return "the stop came before any rank started"
    if exited and len(exited) == total:
        once = exited[0].once if total == 1 else None
        if once:  # the entry point once on this host: it and its own workers
            return f"{once} and what it started exited within {slowest:.1f} s"
        return f"all {total} local ranks exited within {slowest:.1f} s"
    return in_time


def torchrun_failed(run: Observed, host: str) -> tuple[int, str]:
    """torchrun itself failed before any rank reported: our defect when it rejected the
    command line we built, the tail of what it printed otherwise."""
    returncode = run.returncode or ExitCode.FAILED
    for line in reversed(run.torchrun_tail):
        match = USAGE_ERROR.match(line.strip())
        if match:
            return ExitCode.INTERNAL, (
                f"internal error: torchrun (torch {run.torch_version or 'unknown'}) on {host} "
                f"rejected the command line container-entry built: {match.group(1)}"
            )
    # argparse's usage block is noise; torch's own C++ lines ("[E... [c10d] ...") are not
    useful = [
        line.strip()
        for line in run.torchrun_tail
        if line.strip()
        and not line.lstrip().startswith(("usage:", "[-"))
        and line.strip().strip("=-")  # the borders of torchrun's report say nothing
    ]
    tail = " | ".join(useful[-3:])
    return of_returncode(returncode), (
        f"torchrun on {host} failed with {describe_exit(returncode)} before any rank "
        f"reported: {tail or 'no output'}"
    )
