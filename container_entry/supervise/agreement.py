"""The job's one first failure, as every host writes it, and the culprit a hang or a collective
timeout names: the last step of a run's ending, after the monitor named this host's own.

With several hosts the master decides which failure came first (two ranks failing on two hosts
within milliseconds each look first from their own host): each host posts its own earliest,
unless it ended after another host's was heard of (then it is likely a consequence), and writes
what the master decided. One host (or one that lost its master) keeps its own earliest. The
side channel is reached through the session (hosts.session), never its member.
"""

from __future__ import annotations

from dataclasses import replace

from container_entry.common.layout import RunDir
from container_entry.common.records import RankRecord
from container_entry.diagnose import culprit
from container_entry.diagnose.failure import is_collective_timeout, summarized
from container_entry.hosts import SETTLE_SECONDS
from container_entry.hosts.session import Session
from container_entry.supervise.ending import Ending, EndingKind, Observed

# for the master's final word on which failure was the job's first: it comes once every host
# settled, at the latest decision.SETTLE_SECONDS after the first failure reached the master
FIRST_FAILURE_WAIT = SETTLE_SECONDS + 2.0


def agreed(
    ending: Ending, run: Observed, session: Session, host: str, run_dir: RunDir, restarts: int
) -> Ending:
    """This host's ending as the job's: its first failure agreed across hosts, a hang's or a
    timeout's culprit named."""
    return _explained(_first_failure(ending, run, session, host, restarts), session, host, run_dir)


def _first_failure(
    ending: Ending, run: Observed, session: Session, host: str, restarts: int
) -> Ending:
    own = [r for r in run.results.values() if r.failed_on_its_own]
    earliest = min(own, key=lambda r: r.began or float("inf"), default=None)
    if not session.coordinated or session.lost_master():
        return _earliest_of_this_host(ending, earliest)
    if ending.kind not in (EndingKind.FAILED, EndingKind.PEER_FAILED):
        # a hang or a stop: its verdict (posted later) has no start to order it by, so it never
        # takes the place of a decided failure; the others need not wait for it
        session.settle()
        return ending
    if earliest is not None:
        session.post(summarized(earliest, restarts))
    session.settle()
    first = session.first_failure(FIRST_FAILURE_WAIT)
    if first is None:
        return ending
    mine = first.host == host and first.rank in run.results
    return Ending(EndingKind.FAILED if mine else EndingKind.PEER_FAILED, first)


def _earliest_of_this_host(ending: Ending, earliest: RankRecord | None) -> Ending:
    """One host: the failure decided at the first look is the first record to arrive; a rank
    whose failure began earlier may end later (its exit teardown outlasts its peers' errors
    about it), so the earliest to begin among every record, once all are in."""
    if ending.kind is not EndingKind.FAILED or ending.record is None or earliest is None:
        return ending
    if earliest.rank == ending.record.rank or (earliest.began or 0) >= (
        ending.record.began or float("inf")
    ):
        return ending  # keeps what the first look added (a CUDA OOM's memory holders)
    return Ending(EndingKind.FAILED, earliest)


def _explained(ending: Ending, session: Session, host: str, run_dir: RunDir) -> Ending:
    """A hang's first line, or a collective timeout's, names its culprit where the ranks'
    collective records show one: this host's records alone, or every host's as the master
    lined them up."""
    record = ending.record
    if record is None:
        return ending
    failed = ending.kind in (EndingKind.FAILED, EndingKind.PEER_FAILED)
    timed_out = failed and is_collective_timeout(record)
    if ending.kind is not EndingKind.HUNG and not timed_out:
        return ending
    if not session.coordinated:
        found = culprit.analyse(culprit.local_ranks(run_dir, host))
    elif session.lost_master():
        return ending
    else:
        found = session.hang_culprit()
    if timed_out:
        return replace(ending, culprit=found)
    what = culprit.explained(record.what or "hung", found)
    return Ending(EndingKind.HUNG, replace(record, what=what))
