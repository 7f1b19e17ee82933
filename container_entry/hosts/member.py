"""Every host's side of the side channel: the `Member`, in every host's bootstrap (the
master's too). It joins, waits until every host did, hears aborts, posts this host's failure,
and watches the master's heartbeat while sending its own; a member that loses the master stops
its host as for a failure. Nothing from the master counts before its welcome proved it holds
the job's key."""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from container_entry.common.errors import NetworkError
from container_entry.common.logs import log
from container_entry.common.records import RankRecord
from container_entry.diagnose.arrivals import RankArrivals
from container_entry.diagnose.culprit import RankCalls
from container_entry.diagnose.failure import relayed_words
from container_entry.hosts.gathering import CULPRIT_WAIT, fitted_ranks
from container_entry.hosts.handshake import MemberHandshake, Refusal
from container_entry.hosts.liveness import (
    CHECK_INTERVAL,
    HEARTBEAT_INTERVAL,
    LIVENESS_TIMEOUT,
    Lived,
    detail,
    silence,
    tune,
    watcher_slack,
)
from container_entry.hosts.messages import (
    Done,
    Failed,
    MemberBeat,
    Settled,
    ToMember,
    to_member,
)
from container_entry.hosts.network import backoff
from container_entry.hosts.quota import Quota
from container_entry.hosts.schema import fitted_record
from container_entry.hosts.wire import MEMBER_LINE_LIMIT, Invalid, Lines, MessageKind, encode, parse

CONNECT_RETRY = 0.5  # at most this many seconds between tries to reach the master's side channel


class PeerFailure(NetworkError):
    """Another host failed, or the master gave up, before this host started any worker. It
    exits with the failed host's code."""

    exit_code: int  # the relayed failure's code, any int

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Member:
    """Runs in every host's bootstrap (the master's too): joins, hears aborts, posts failures,
    and watches the master's heartbeat while sending its own. Its state is read by the
    bootstrap's threads: `started`, `aborted` (`abort` or `lost_master`), `refused`."""

    def __init__(
        self,
        host: str,
        master: str,
        port: int,
        *,
        liveness_timeout: float = LIVENESS_TIMEOUT,
        interval: float = HEARTBEAT_INTERVAL,
        machine: str | None = None,
        workers: int = 1,
        key: bytes = b"",
    ) -> None:
        self.host = host
        self.machine = machine  # this kernel's boot id
        self.workers = workers
        self.machines: dict[str, list[int]] = {}  # from the master's start: boot id -> tally
        self.master = master
        self.port = port
        self.liveness_timeout = liveness_timeout
        self.interval = interval
        self.handshake = MemberHandshake(key, host, machine, workers, master, port)
        self.refused: str | None = None  # why the join cannot be (in words), if so
        self.sock: socket.socket | None = None
        self.started = threading.Event()
        self.abort: RankRecord | None = None  # the failure another host relayed
        self.aborted_at: float | None = None  # when it arrived (this host's clock)
        self.first: RankRecord | None = None  # the job's first failure, as the master decided
        self.decided = threading.Event()  # the master's decision is final (`first`)
        self.culprit: str | None = None  # a hang's culprit, from every host's records
        self.explained = threading.Event()
        self.lost_master = False  # the master's bootstrap went away before we finished
        self.lost_reason: str | None = None  # how: "no heartbeat for 10 s", "closed", ...
        self.aborted = threading.Event()  # either of the two
        self.finished = False
        self.posted = False  # this host told the others why it failed
        self.posted_began: float | None = None  # when the failure it posted began
        self.waiting_for: list[str] = []  # hosts the master still waited for at its last beat
        self.waiting_count = 0
        self.heard = 0.0
        # set while this host's job runs; its value None: no evidence yet (no rank printed)
        self.idle: Callable[[], float | None] | None = None
        self.quota = Quota()
        self._send_lock = threading.Lock()
        self._joined = False  # our join went out (nothing else goes before it)

    # -- the join ---------------------------------------------------------------------------
    def join(self, timeout: float, *, verdict_grace: float = 0.0) -> None:
        """Connect (retrying), then wait until the master says every host joined. A member
        gives the master `verdict_grace` seconds more than its own timeout, so the master's
        verdict (which host never joined) arrives before a member gives up on its own."""
        deadline = self._connect(timeout)
        deadline = max(deadline, time.monotonic() + timeout) + verdict_grace
        # the master's hello comes first; the listener answers it with our join
        threading.Thread(target=self._listen, daemon=True, name="side-channel").start()
        while not self.started.is_set():
            if self.aborted.is_set():
                if self.refused:
                    raise NetworkError(self.refused)
                if self.lost_master:
                    raise NetworkError(
                        f"the master host {self.master} {self._lost_words()} during the join"
                    )
                raise self._failure_before_start()
            if time.monotonic() >= deadline:
                raise NetworkError(self._join_timeout_text(timeout))
            self.started.wait(0.1)

    def _connect(self, timeout: float) -> float:
        """Reach the master's side channel within `timeout`; the deadline it set."""
        deadline = time.monotonic() + timeout
        attempt = 0
        while self.sock is None:
            remaining = deadline - time.monotonic()
            try:
                sock = socket.create_connection(
                    (self.master, self.port), timeout=max(0.5, min(5.0, remaining))
                )
            except OSError:
                if time.monotonic() >= deadline:
                    raise NetworkError(
                        f"could not reach the master host {self.master}:{self.port} "
                        f"within {timeout:g} s"
                    ) from None
                # the master's bootstrap may start a moment after this one: ask again soon
                time.sleep(min(backoff(attempt, CONNECT_RETRY), max(0.0, remaining)))
                attempt += 1
                continue
            tune(sock, self.liveness_timeout)
            # the listener's tick: it looks for silence this often; bounds sends too
            sock.settimeout(min(self.interval, CHECK_INTERVAL))
            self.sock = sock
        return deadline

    def _lost_words(self) -> str:
        if self.lost_reason in ("closed", "connection reset by peer"):
            return "went away (its bootstrap exited, was killed or crashed)"
        return f"stopped answering ({self.lost_reason})"

    def _join_timeout_text(self, timeout: float) -> str:
        text = f"not every host joined the job within {timeout:g} s"
        if self.waiting_for:
            names = ", ".join(self.waiting_for)
            more = self.waiting_count - len(self.waiting_for)
            names += f" and {more} more" if more > 0 else ""
            text += f": the master {self.master} was still waiting for {names}"
        return text

    def _failure_before_start(self) -> PeerFailure:
        """A relayed failure before any worker started, in this host's own words."""
        failure = self.abort or RankRecord(host=None, rank=None, returncode=1)
        return PeerFailure(
            f"{relayed_words(failure)}; {self.host} started no worker because of it",
            failure.returncode or 1,
        )

    # -- the listener thread ----------------------------------------------------------------
    def _listen(self) -> None:
        """Beats out, the master's messages in, until this host finished, was refused, or
        the master went away or silent (then this host stops: `aborted`)."""
        sock = self.sock
        assert sock is not None
        lines = Lines(MEMBER_LINE_LIMIT)
        clock = Lived(watcher_slack(self.liveness_timeout))  # this thread's own: `heard`
        self.heard = clock.now()
        last_sent = time.monotonic()
        reason = "closed"
        while not self.finished and not self.refused:
            now = clock.now()
            if self._joined and time.monotonic() - last_sent >= self.interval:
                self._send(
                    MemberBeat(type=MessageKind.BEAT, idle=_idle(self.idle), time=time.time())
                )
                last_sent = time.monotonic()
            if now - self.heard > self.liveness_timeout:
                reason = silence(self.liveness_timeout)
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError as error:
                if error.errno is None:  # our own tick, not the kernel's ETIMEDOUT
                    continue
                reason = detail(error, self.liveness_timeout)
                break
            except OSError as error:
                reason = detail(error, self.liveness_timeout)
                break
            if not chunk:
                break
            self.heard = clock.now()
            self._receive(lines.feed(chunk))
        self._stopped_listening(sock, reason)

    def _receive(self, items: list[bytes | Invalid]) -> None:
        for item in items:
            try:
                if isinstance(item, Invalid):
                    raise item
                self._handle(to_member(parse(item)))
            except Invalid as error:
                self.quota.log(f"ignored a message from the master host {self.master}: {error}")
            except Exception as error:  # a defect of ours must not end the listening
                self.quota.log(f"internal error: {type(error).__name__}: {error}")
            if self.refused:
                return

    def _stopped_listening(self, sock: socket.socket, reason: str) -> None:
        if self.refused:  # said by join(), which raises it
            self.lost_master = True
            self.lost_reason = "refused"
            self.aborted.set()
        elif not self.finished and not self.aborted.is_set():
            self.lost_master = True
            self.lost_reason = reason
            log(f"the master host {self.master} {self._lost_words()}: stopping this host")
            self.aborted.set()
        self.explained.set()  # no culprit can come now: nobody waits for it in vain
        if not self.finished:  # a silent master gets no more of our beats
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _handle(self, message: ToMember) -> None:
        if not self.handshake.trusted:
            self._before_welcome(message)
        elif message["type"] == MessageKind.START:
            self.machines = dict(message["machines"])
            self.started.set()
        elif message["type"] == MessageKind.ABORT:
            self.abort = RankRecord.from_json(message["failure"])
            self.aborted_at = time.time()
            self.aborted.set()
        elif message["type"] == MessageKind.FIRST:
            self.first = RankRecord.from_json(message["failure"])
            if message["final"]:
                self.decided.set()
        elif message["type"] == MessageKind.CULPRIT:
            self.culprit = message["what"]
            self.explained.set()
        elif message["type"] == MessageKind.BEAT and "waiting" in message:
            self.waiting_for = list(message["waiting"] or [])
            self.waiting_count = int(message.get("waiting_count") or 0)

    def _before_welcome(self, message: ToMember) -> None:
        """The handshake: answer the hello with a proven join, check the master's welcome."""
        try:
            if message["type"] == MessageKind.HELLO and not self.handshake.answered:
                join = self.handshake.answer(message)
                self._joined = True
                self._send(join)
            elif message["type"] == MessageKind.WELCOME and self.handshake.answered:
                self.handshake.check(message)
            elif message["type"] == MessageKind.REFUSED:
                raise self.handshake.refused(message)
            elif message["type"] != MessageKind.BEAT:  # a proven join waits for its address check
                kind = message["type"].value
                self.quota.log(f"ignored {kind!r} from {self.master} before its welcome")
        except Refusal as refusal:
            self.refused = str(refusal)

    # -- for the bootstrap ------------------------------------------------------------------
    def _send(self, message: Mapping[str, Any]) -> None:
        if self.sock is None or not self._joined:
            return
        with self._send_lock, contextlib.suppress(OSError):
            self.sock.sendall(encode(message))

    def machine_share(self) -> tuple[int, int]:
        """(hosts, workers) of this job on this host's machine, as the master counted them."""
        hosts, workers = self.machines.get(self.machine or "", [1, self.workers])
        return int(hosts), int(workers)

    def post_failure(self, failure: RankRecord) -> None:
        """Tell the others why this host failed, and never echo another's failure: after an
        abort only a failure with a moment of its own (a rank's, a stop's signal) that began
        before the abort arrived, which may still be the job's first (the master decides).
        Once, unless a rank's failure that began earlier than the one posted turns up: the
        first rank seen to end is posted at once, and a victim (its peer's exit closed its
        connection) may end before its culprit."""
        began = failure.began
        if self.posted and not (
            failure.rank is not None
            and began is not None
            and self.posted_began is not None
            and began < self.posted_began
        ):
            return
        if self.aborted.is_set():
            arrived = self.aborted_at
            if began is None or arrived is None or began > arrived:
                return
        self.posted, self.posted_began = True, began
        self._send(Failed(type=MessageKind.FAILED, failure=fitted_record(failure.relayed())))

    def settle(self) -> None:
        """This host posted every failure of its own that may be the job's first: the
        master's decision need not wait for it any more."""
        self._send(Settled(type=MessageKind.SETTLED))

    def first_failure(self, timeout: float) -> RankRecord | None:
        """The job's first failure as the master decided it for good, waiting up to `timeout`
        for that word (then the latest word, if any)."""
        self.decided.wait(timeout)
        return self.first

    def post_records(self, ranks: Sequence[RankCalls]) -> None:
        """This host's ranks' collective records, for the master's culprit (gathering.py)."""
        self._send({"type": MessageKind.RECORDS, "ranks": fitted_ranks(ranks)})  # as on the wire

    def post_arrivals(self, ranks: Sequence[RankArrivals]) -> None:
        """This host's ranks' straggler summaries (diagnose/arrivals.py), bounded to fit a line."""
        self._send({"type": MessageKind.ARRIVALS, "ranks": [r.to_json() for r in ranks]})

    def hang_culprit(self, timeout: float = CULPRIT_WAIT) -> str | None:
        """The culprit as the master found it in every host's records; None: it named no one,
        said nothing within `timeout`, or is gone."""
        self.explained.wait(timeout)
        return self.culprit

    def done(self) -> None:
        self.finished = True
        self._send(Done(type=MessageKind.DONE, host=self.host))

    def close(self) -> None:
        self.finished = True
        if self.sock is not None:
            # shutdown() sends the FIN even while the listener thread sits in recv(); a bare
            # close() leaves the master waiting for this host until its timeout
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self.sock.close()


def _idle(idle: Callable[[], float | None] | None) -> float | None:
    """This host's ranks' silence for the beat, within the schema (None: no job running, or no
    rank printed yet where that is what counts)."""
    value = idle() if idle is not None else None
    if value is None or not math.isfinite(value):
        return None
    return min(max(float(value), 0.0), 1e12)
