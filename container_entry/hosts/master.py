"""The master's side of the side channel: the `Coordinator`, in the master host's bootstrap.
It waits until every host joined (so a host that never comes is reported before any worker
starts), relays the job's first failure to every host, and watches every host's heartbeat.
One thread serves every connection (`hub`); admission, liveness and the first-failure decision
are each their own piece, composed here."""

from __future__ import annotations

import selectors
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from container_entry.common.logs import log
from container_entry.common.records import RankRecord
from container_entry.diagnose.arrivals import RankArrivals, shift
from container_entry.hosts import admission
from container_entry.hosts.decision import SETTLE_SECONDS, Change, FirstFailure
from container_entry.hosts.gathering import Gathering
from container_entry.hosts.hub import ACCEPT, WAKE, Hub
from container_entry.hosts.liveness import (
    CHECK_INTERVAL,
    HEARTBEAT_INTERVAL,
    LIVENESS_TIMEOUT,
    Lived,
    Liveness,
    vanished_record,
    watcher_slack,
)
from container_entry.hosts.messages import (
    WAITING_NAMES,
    Abort,
    Culprit,
    First,
    MasterBeat,
    Start,
    ToMaster,
    to_master,
)
from container_entry.hosts.peer import Peer, PeerState
from container_entry.hosts.quota import Quota
from container_entry.hosts.roster import Roster
from container_entry.hosts.schema import Relayed, fitted_record
from container_entry.hosts.wire import Invalid, MessageKind, encode, parse

MAX_HELD_ARRIVALS = 8192  # ranks' summaries held between two of the watch's takes


class Coordinator:
    """Runs in the master's bootstrap: admits the job's hosts, collects joins, relays the
    first failure, watches every host's heartbeat. One thread serves every connection.

    `key` is the job's key (`job_key`); `resolve` gives the addresses a host name resolves to
    for the address check (None: no address check, for tests with made-up names)."""

    def __init__(
        self,
        hosts: Sequence[str],
        port: int,
        *,
        liveness_timeout: float = LIVENESS_TIMEOUT,
        interval: float = HEARTBEAT_INTERVAL,
        hang_timeout: float | None = 0.0,
        key: bytes = b"",
        resolve: Callable[[str], Iterable[str]] | None = None,
        auth_timeout: float = admission.AUTH_TIMEOUT,
        address_wait: float = admission.ADDRESS_WAIT,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> None:
        self.roster = Roster(hosts)
        self.interval = interval
        self.check = min(CHECK_INTERVAL, interval)  # how often the loop looks for silence
        self.clock = Lived(watcher_slack(liveness_timeout))  # the loop's own: peers' `heard`
        self._beat_at = 0.0  # when the loop last sent heartbeats (monotonic)
        self.quota = Quota()
        self.liveness = Liveness(liveness_timeout, hang_timeout, len(self.roster.hosts))
        self.decision = FirstFailure(settle_seconds)
        self.gathering = Gathering()
        backlog = len(self.roster.hosts) + admission.MAX_UNJOINED
        self.hub = Hub(port, backlog, liveness_timeout, self._gone)
        self.admission = admission.Admission(
            self.roster,
            key,
            self.hub,
            self.quota,
            self._admitted,
            resolve=resolve,
            auth_timeout=auth_timeout,
            address_wait=address_wait,
        )
        self._posted: list[Relayed] = []  # failures the master's own threads posted
        # every host's straggler summaries, on the master's clock, until its watch takes them
        self._arrivals: list[RankArrivals] = []
        self._arrivals_lock = threading.Lock()
        self._closing = False
        self.thread = threading.Thread(target=self._loop, daemon=True, name="coordinator")
        self.thread.start()

    # -- for the master's main thread -------------------------------------------------------
    @property
    def first_failure(self) -> Relayed | None:
        return self.decision.failure

    @property
    def finished(self) -> set[str]:
        return self.roster.finished

    @property
    def vanished(self) -> dict[str, str]:
        return self.roster.vanished

    @property
    def refused(self) -> list[tuple[str, str]]:
        """(peer address, why) of the latest 100 connections refused."""
        return self.admission.refused

    def post(self, failure: RankRecord) -> None:
        """Relay a failure of the master's own bootstrap (from any thread)."""
        self._posted.append(fitted_record(failure.relayed()))
        self.hub.wake()

    def has_joined(self, host: str) -> bool:
        return self.roster.has_joined(host)

    def unfinished(self) -> set[str]:
        """Hosts that joined and have not finished, left or gone silent yet."""
        return self.roster.unfinished()

    def missing(self) -> list[str]:
        return self.roster.missing()

    def all_finished(self) -> bool:
        return self.roster.all_finished()

    def wait_finished(self, timeout: float, given_up: Callable[[], bool] = bool) -> None:
        """Keep serving until every host reported done, closed its connection or went silent
        (or `timeout` passes, or `given_up()`), so a relayed failure reaches every host before
        the master's bootstrap exits. A frozen host ends this wait after the liveness timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.thread.is_alive() and not given_up():
            if self.roster.all_finished():
                return
            time.sleep(0.1)

    def close(self) -> None:
        self._closing = True
        self.hub.wake()
        self.thread.join(timeout=5)
        self.hub.close_wake()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        next_tick = time.monotonic()
        try:
            while not self._closing:
                for data, mask in self.hub.select(max(0.0, next_tick - time.monotonic())):
                    try:
                        self._event(data, mask)
                    except Exception as error:  # one peer's trouble is that peer's alone
                        self._defect(data, error)
                if time.monotonic() >= next_tick:
                    self._tick()
                    next_tick = time.monotonic() + self.check
        except Exception as error:  # a defect here must not end the job silently
            log(f"internal error of the side channel: {type(error).__name__}: {error}")
        finally:
            self.hub.shut()

    def _event(self, data: Any, mask: int) -> None:
        if data == ACCEPT:
            for new in self.hub.accept(time.monotonic()):
                new.heard = self.clock.now()
                self.admission.greet(new)
        elif data == WAKE:
            self.hub.woken()
            while self._posted:
                self.relay_failure(self._posted.pop(0))
            self.admission.woken()
        elif data.open:  # not dropped earlier in this batch
            peer: Peer = data
            if mask & selectors.EVENT_READ:
                self._read(peer)
            if peer.open and mask & selectors.EVENT_WRITE:
                self.hub.flush(peer)

    def _defect(self, data: Any, error: Exception) -> None:
        """A defect of ours while serving one peer: said, and that peer alone pays (a stranger
        is dropped; a host keeps its connection, losing the message)."""
        what = f"{type(error).__name__}: {error}"
        if isinstance(data, Peer):
            self.quota.log(f"internal error serving {data.name}: {what}")
            if data.state is not PeerState.JOINED:
                self._drop(data)
        else:
            self.quota.log(f"internal error: {what}")

    def _read(self, peer: Peer) -> None:
        chunk = self.hub.receive(peer)
        if chunk is None or peer.state is PeerState.CLOSING:  # refused: read only to close
            return
        peer.heard = self.clock.now()
        for item in peer.lines.feed(chunk):
            if not peer.open or peer.state is PeerState.CLOSING:  # refused: the rest unread
                return
            try:
                if isinstance(item, Invalid):
                    raise item
                raw = parse(item)
                if peer.state is PeerState.NEW and raw.get("type") != MessageKind.JOIN:
                    kind = str(raw.get("type"))[:40]
                    raise Invalid(f"not a host of this job: {kind!r} before a join")
                message = to_master(raw)
            except Invalid as error:
                self._misbehaved(peer, str(error))
                continue
            self._handle(peer, message)

    def _misbehaved(self, peer: Peer, why: str) -> None:
        """A stranger is refused; a host of the job loses that message only."""
        if peer.state is PeerState.JOINED:
            self.quota.log(f"ignored a message from {peer.name}: {why}")
        else:
            self.admission.refuse(peer, why)

    def _handle(self, peer: Peer, message: ToMaster) -> None:
        """A message from a host of the job (anything else goes to the admission)."""
        if peer.state is not PeerState.JOINED:
            self.admission.receive(peer, message)
        elif message["type"] == MessageKind.JOIN:
            self.quota.log(f"ignored a second join from {peer.name}")
        elif message["type"] == MessageKind.FAILED:
            failure = message["failure"]
            if failure.get("host") not in (None, peer.host):
                self.quota.log(
                    f"ignored a failure from {peer.name} about another host "
                    f"({str(failure.get('host'))[:60]!r}): a host speaks for itself only"
                )
                return
            failure["host"] = peer.host
            peer.posted = True
            self.relay_failure(failure, origin=peer)
        elif message["type"] == MessageKind.SETTLED:
            peer.settled = True
            self._final_if_due()
        elif message["type"] == MessageKind.BEAT:
            self.liveness.heard(peer, message)
        elif message["type"] == MessageKind.DONE:
            if message["host"] not in (None, peer.host):
                self.quota.log(f"ignored 'done' from {peer.name} for another host")
                return
            peer.said_done = True
            self.roster.finish(peer)
            self._final_if_due()
        elif message["type"] == MessageKind.RECORDS:
            for rank in message["ranks"]:
                rank.host = peer.host or "?"  # a host speaks for itself only
            self.gathering.offer(peer.host or "?", message["ranks"], time.monotonic())
            self._culprit_if_due()
        elif message["type"] == MessageKind.ARRIVALS:
            self.offer_arrivals(message["ranks"], peer.host or "?", peer.skew or 0.0)

    def offer_arrivals(self, ranks: Sequence[RankArrivals], host: str, offset: float) -> None:
        """A host's summaries (a host speaks for itself only), put on the master's clock with
        the offset its heartbeats measured; at most MAX_HELD_ARRIVALS wait for the watch."""
        moved = [shift(replace(r, host=host), offset) for r in ranks]
        with self._arrivals_lock:
            self._arrivals = [*self._arrivals, *moved][-MAX_HELD_ARRIVALS:]

    def take_arrivals(self) -> list[RankArrivals]:
        """What the hosts sent since the last call (the master's straggler watch)."""
        with self._arrivals_lock:
            taken, self._arrivals = self._arrivals, []
        return taken

    def _admitted(self, peer: Peer) -> None:
        """A host joined (its welcome sent): tell it of a failure already decided, or tell
        every host that all joined; then what it said while its address was checked."""
        everyone = self.roster.join(peer)
        failure = self.decision.failure
        if failure is not None:  # too late: tell it at once rather than at its timeout
            self.hub.send(peer, Abort(type=MessageKind.ABORT, failure=failure))
        elif everyone and not self.roster.started:
            self.roster.started = True
            start = Start(type=MessageKind.START, machines=self.roster.machines())
            for other in self.roster.open_peers():
                self.hub.send(other, start)
        held, peer.held = peer.held, []
        for message in held:
            if peer.open:
                self._handle(peer, message)

    # -- every interval ---------------------------------------------------------------------
    def _tick(self) -> None:
        """Every `check`: anyone silent for the liveness timeout (on the loop's own clock) is
        gone; a connection that has not joined in time is refused; the hang watchdog's verdict.
        Every `interval`: heartbeats out."""
        now, lived = time.monotonic(), self.clock.now()
        beating = now - self._beat_at >= self.interval
        if beating:
            self._beat_at = now
        plain = MasterBeat(type=MessageKind.BEAT)
        beat = plain
        if not self.roster.started:  # who is still missing, for a member that gives up
            waiting = self.roster.missing()
            beat = MasterBeat(
                type=MessageKind.BEAT, waiting=waiting[:WAITING_NAMES], waiting_count=len(waiting)
            )
        beats = encode(beat), encode(plain)
        for peer in self.hub.peers():
            if not peer.open:
                continue
            try:
                self._tend(peer, now, lived, beating, *beats)
            except Exception as error:
                self._defect(peer, error)
        self._culprit_if_due()
        self._final_if_due()
        if self.decision.failure is None:
            hung = self.liveness.hung(self.roster.open_peers())
            if hung is not None:
                log(f"{hung.what}: stopping the job on every host")
                self.relay_failure(hung.relayed())

    def _tend(
        self, peer: Peer, now: float, lived: float, beating: bool, beat: bytes, plain: bytes
    ) -> None:
        if peer.state in (PeerState.NEW, PeerState.CLOSING):
            self.admission.expire(peer, now)
        elif (silence := self.liveness.silent(peer, lived)) is not None:
            self._gone(peer, silence)
        elif peer.outbox or not beating:  # a peer that stopped reading gets no pile of beats
            pass
        elif peer.state is PeerState.JOINED:
            self.hub.queue(peer, beat)
        else:  # proven, its address still being checked: only that we are here
            self.hub.queue(peer, plain)
            self.admission.recheck(peer, now)

    def _culprit_if_due(self) -> None:
        """Every host's records lined up, once all sent theirs or the wait is over."""
        hosts = [p.host for p in self.roster.open_peers() if p.host]
        if not self.gathering.due(hosts, time.monotonic()):
            return
        what = self.gathering.verdict()
        for peer in self.roster.open_peers():
            self.hub.send(peer, Culprit(type=MessageKind.CULPRIT, what=what))

    # -- endings and failures ---------------------------------------------------------------
    def _drop(self, peer: Peer) -> None:
        self.admission.forget(peer)
        self.hub.drop(peer)

    def _gone(self, peer: Peer, detail: str) -> None:
        """A connection ended or went silent. For a host that neither finished nor posted a
        failure that is a failure of the job: relay it, naming the host. A connection that
        never joined is no news to anyone."""
        if peer.state in (PeerState.NEW, PeerState.CHECKING):
            self.quota.log(f"dropped {peer.name} ({detail} before it joined)")
        self._drop(peer)
        failed = self.decision.failure is not None
        if peer.host is not None and self.roster.leave(peer, detail, failed=failed):
            record = vanished_record(peer.host, detail)
            log(f"{record.what}: stopping the job on every host")
            self.relay_failure(record.relayed())
        self._final_if_due()  # the hosts left may all have settled

    def relay_failure(self, failure: Relayed, origin: Peer | None = None) -> None:
        """Offer a failure to the job's first-failure decision (loop thread). The first stops
        every other host at once (`abort`); every change of the decision goes to every host
        (`first`), the poster included; hosts write their first line from the final one
        (`_final_if_due`). The master's own posts (no `origin`) are on its own clock."""
        change = self.decision.offer(failure, 0.0 if origin is None else origin.skew)
        if change is Change.NONE:
            return
        for peer in self.roster.open_peers():
            if change is Change.FIRST and peer is not origin:
                self.hub.send(peer, Abort(type=MessageKind.ABORT, failure=failure))
            self.hub.send(peer, First(type=MessageKind.FIRST, failure=failure, final=False))
        self._final_if_due()

    def _final_if_due(self) -> None:
        """The decision made final, and said so to every host, once every host still in the
        job settled or finished, or the settling wait is over (decision.SETTLE_SECONDS)."""
        peers = self.roster.open_peers()
        settled = all(p.settled or p.said_done for p in peers)
        if not self.decision.settle(settled, time.monotonic()):
            return
        failure = self.decision.failure
        assert failure is not None
        for peer in peers:
            self.hub.send(peer, First(type=MessageKind.FIRST, failure=failure, final=True))
