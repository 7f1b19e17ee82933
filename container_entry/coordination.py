"""A job-wide side channel between the bootstraps of all hosts, hosted by the master's.

torchrun has no way to tell a healthy host that another host failed: the healthy one keeps
training until a collective times out, or waits at the exit barrier for 300 s. Here every host
keeps one TCP connection to the master's bootstrap. Before launch the master waits until every
host has joined (so a host that never comes is reported before any worker starts); when any
host fails it posts the failure and the master relays it to all, so every host stops within
seconds and names the rank that failed first.

Liveness (docs/liveness.md): both ends send a heartbeat every `HEARTBEAT_INTERVAL` seconds and
watch what they hear. A host whose bootstrap is killed closes its connection (the kernel sends
the FIN): noticed at once. One that froze (SIGSTOP, a hung machine) or lost the network keeps its
socket open and says nothing: noticed once nothing came for `LIVENESS_TIMEOUT` seconds (TCP's
user timeout ends the connection at the same bound where sent data goes unacknowledged). The
master relays either as a failure of the job naming the host; a member that loses the master
stops the same way. Bound: a vanished host is noticed by every other host within
LIVENESS_TIMEOUT + HEARTBEAT_INTERVAL + the relay (well under a second), 11-12 s.

The master serves every host from one thread (a selector loop), so its cost stays flat in the
number of hosts; a host that stops reading can never block it. Newline-delimited JSON; stdlib.
"""

from __future__ import annotations

import contextlib
import errno
import json
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from container_entry.errors import NetworkError
from container_entry.hang import HUNG_EXIT_CODE, hung_text
from container_entry.logs import log
from container_entry.network import backoff
from container_entry.records import RankRecord

HEARTBEAT_INTERVAL = 1.0  # seconds between heartbeats, both ways
LIVENESS_TIMEOUT = 10.0  # seconds of silence after which a peer is gone
# a member waits this much longer than the master for every host to join, so the master's word
# on which host never joined reaches it before it gives up on its own
JOIN_VERDICT_GRACE = LIVENESS_TIMEOUT + 5.0
CONNECT_RETRY = 0.5  # at most this many seconds between tries to reach the master's side channel
VANISHED_EXIT_CODE = 1  # a host vanished: no exit code of its own (as a lost master)
_MAX_PENDING = 1 << 20  # bytes queued for a peer that stopped reading; beats are dropped then
_WAITING_NAMES = 16  # host names a heartbeat lists while the join is incomplete


def tune(sock: socket.socket, timeout: float) -> None:
    """Kernel-level liveness beside the heartbeats: data unacknowledged for `timeout` ends the
    connection (TCP_USER_TIMEOUT), and an idle one is probed (keepalive)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    options = (
        ("TCP_NODELAY", 1),
        ("TCP_KEEPIDLE", max(1, int(timeout / 2))),
        ("TCP_KEEPINTVL", 1),
        ("TCP_KEEPCNT", max(1, int(timeout / 2))),
        ("TCP_USER_TIMEOUT", int(timeout * 1000)),
    )
    for name, value in options:
        option = getattr(socket, name, None)
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


def _split(buffer: bytes) -> tuple[list[dict[str, Any]], bytes]:
    """Complete JSON lines out of `buffer`, and what is left of it."""
    messages = []
    *lines, rest = buffer.split(b"\n")
    for line in lines:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict):
            messages.append(message)
    return messages, rest


def vanished_record(host: str, detail: str) -> RankRecord:
    return RankRecord(
        host=host, rank=None, returncode=VANISHED_EXIT_CODE, what=vanished_text(host, detail)
    )


def vanished_text(host: str, detail: str) -> str:
    """What a host's vanishing looks like from the master. A killed process's socket is closed
    by the kernel: a FIN, or a reset where our heartbeats were still unread in it."""
    if detail in ("closed", "connection reset by peer"):
        how = "closed" if detail == "closed" else "reset"
        return (
            f"host {host} left the job without a word (its side channel was {how}): its "
            "bootstrap was killed or crashed"
        )
    return (
        f"host {host} stopped answering ({detail}): its bootstrap died, froze or lost the network"
    )


class _Peer:
    """One connection at the master: a host's bootstrap, once it said who it is."""

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.host: str | None = None
        self.inbox = b""
        self.outbox = bytearray()
        self.heard = now  # the last time anything arrived
        self.said_done = False
        self.posted = False  # it posted a failure: its leaving is no news
        self.open = True
        self.machine: str | None = None  # its kernel's boot id, as it said at the join
        self.workers = 0
        self.idle: float | None = None  # its ranks' silence at its last beat; None: no job yet


class Coordinator:
    """Runs in the master's bootstrap: collects joins, relays the first failure, watches every
    host's heartbeat. One thread serves every connection."""

    def __init__(
        self,
        hosts: Sequence[str],
        port: int,
        *,
        liveness_timeout: float = LIVENESS_TIMEOUT,
        interval: float = HEARTBEAT_INTERVAL,
        hang_timeout: float = 0.0,
    ) -> None:
        self.hosts = tuple(hosts)
        self.liveness_timeout = liveness_timeout
        self.hang_timeout = hang_timeout  # 0: no hang watchdog
        self.interval = interval
        self.joined: dict[str, _Peer] = {}
        self.finished: set[str] = set()
        self.vanished: dict[str, str] = {}  # host -> what happened
        self.first_failure: dict[str, Any] | None = None
        self.started = False
        self.lock = threading.Lock()  # guards the state above against readers' threads
        self.server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # a previous run's connections in TIME_WAIT must not make the port look busy
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.server.bind(("0.0.0.0", port))
        except OSError as error:
            self.server.close()
            raise NetworkError(
                f"coordination port {port} on the master host is in use ({error.strerror}): "
                "set CONTAINER_ENTRY_MASTER_PORT to a free port (this uses it + 1)"
            ) from None
        self.server.listen(len(self.hosts) + 16)
        self.server.setblocking(False)
        self._closing = False
        self._posted: list[dict[str, Any]] = []  # failures the master's own threads posted
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.server, selectors.EVENT_READ, "accept")
        self.selector.register(self._wake_read, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._loop, daemon=True, name="coordinator")
        self.thread.start()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        next_tick = time.monotonic()
        try:
            while not self._closing:
                events = self.selector.select(max(0.0, next_tick - time.monotonic()))
                for key, mask in events:
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_read.recv(4096)
                        while self._posted:
                            self.relay_failure(self._posted.pop(0))
                    elif key.data.open:  # not dropped earlier in this batch
                        peer: _Peer = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(peer)
                        if peer.open and mask & selectors.EVENT_WRITE:
                            self._flush(peer)
                if time.monotonic() >= next_tick:
                    self._tick()
                    next_tick = time.monotonic() + self.interval
        except Exception as error:  # a defect here must not end the job silently
            log(f"internal error of the side channel: {type(error).__name__}: {error}")
        finally:
            for key in list(self.selector.get_map().values()):
                if isinstance(key.data, _Peer):
                    self._drop(key.data)
            self.selector.close()
            with contextlib.suppress(OSError):
                self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            tune(connection, self.liveness_timeout)
            connection.setblocking(False)
            peer = _Peer(connection, time.monotonic())
            self.selector.register(connection, selectors.EVENT_READ, peer)

    def _read(self, peer: _Peer) -> None:
        try:
            chunk = peer.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            self._gone(peer, _detail(error, self.liveness_timeout))
            return
        if not chunk:
            self._gone(peer, "closed")
            return
        peer.heard = time.monotonic()
        messages, peer.inbox = _split(peer.inbox + chunk)
        for message in messages:
            self._handle(peer, message)

    def _handle(self, peer: _Peer, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "join" and message.get("host") in self.hosts:
            host = message["host"]
            peer.host = host
            peer.machine = message.get("machine")
            peer.workers = int(message.get("workers") or 0)
            with self.lock:
                self.joined[host] = peer
                everyone = len(self.joined) == len(self.hosts)
                failure = self.first_failure
            if failure is not None:  # too late: tell it at once rather than at its timeout
                self._send(peer, {"type": "abort", "failure": failure})
            elif everyone and not self.started:
                self.started = True
                start = {"type": "start", "machines": self._machines()}
                for other in self._open_peers():
                    self._send(other, start)
        elif kind == "failed":
            peer.posted = True
            self.relay_failure(message.get("failure") or {}, origin=peer)
        elif kind == "beat":
            idle = message.get("idle")
            peer.idle = float(idle) if isinstance(idle, (int, float)) else None
        elif kind == "done" and peer.host:
            peer.said_done = True
            with self.lock:
                self.finished.add(peer.host)

    def _machines(self) -> dict[str, list[int]]:
        """boot id -> [hosts, workers] of this job on that machine: several hosts on one
        kernel (SageMaker local mode) share its cores."""
        machines: dict[str, list[int]] = {}
        for peer in self._open_peers():
            if peer.machine:
                tally = machines.setdefault(peer.machine, [0, 0])
                tally[0] += 1
                tally[1] += peer.workers
        return machines

    def _tick(self) -> None:
        """Heartbeats out; anyone silent for the liveness timeout is gone."""
        now = time.monotonic()
        beat: dict[str, Any] = {"type": "beat"}
        if not self.started:
            waiting = self.missing()
            beat.update(waiting=waiting[:_WAITING_NAMES], waiting_count=len(waiting))
        data = _encode(beat)
        for key in list(self.selector.get_map().values()):
            peer = key.data
            if not isinstance(peer, _Peer) or not peer.open:
                continue
            silent = now - peer.heard
            if silent > self.liveness_timeout:
                self._gone(peer, f"no heartbeat for {self.liveness_timeout:g} s")
            elif not peer.outbox:  # a peer that stopped reading gets no pile of beats
                self._queue(peer, data)
        if self.hang_timeout and self.first_failure is None:
            self._check_hang()

    def _check_hang(self) -> None:
        """The job hung when every host still running its job has had no output from any
        rank for the hang timeout (a host still preparing, or done, is no evidence)."""
        running = [p for p in self._open_peers() if not p.said_done]
        if not running or any(p.idle is None or p.idle < self.hang_timeout for p in running):
            return
        what = hung_text(self.hang_timeout, len(self.hosts))
        log(f"{what}: stopping the job on every host")
        self.relay_failure(
            RankRecord(host=None, rank=None, returncode=HUNG_EXIT_CODE, what=what).relayed()
        )

    # -- sending ----------------------------------------------------------------------------
    def _send(self, peer: _Peer, message: dict[str, Any]) -> None:
        self._queue(peer, _encode(message))

    def _queue(self, peer: _Peer, data: bytes) -> None:
        if not peer.open or len(peer.outbox) > _MAX_PENDING:
            return
        peer.outbox += data
        self._flush(peer)

    def _flush(self, peer: _Peer) -> None:
        try:
            sent = peer.sock.send(peer.outbox)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as error:
            self._gone(peer, _detail(error, self.liveness_timeout))
            return
        del peer.outbox[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if peer.outbox else 0)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.modify(peer.sock, events, peer)

    def _open_peers(self) -> list[_Peer]:
        return [p for p in self.joined.values() if p.open]

    # -- endings ----------------------------------------------------------------------------
    def _drop(self, peer: _Peer) -> None:
        if not peer.open:
            return
        peer.open = False
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(peer.sock)
        with contextlib.suppress(OSError):
            peer.sock.close()

    def _gone(self, peer: _Peer, detail: str) -> None:
        """A connection ended or went silent. For a host that neither finished nor posted a
        failure that is a failure of the job: relay it, naming the host."""
        self._drop(peer)
        host = peer.host
        with self.lock:
            if host is None or self.joined.get(host) is not peer:
                return
            self.finished.add(host)  # nothing more to wait for from it
            # after a failure every host leaves: only a host gone first, unannounced, is news
            news = not (peer.said_done or peer.posted or self.first_failure)
            if news:
                self.vanished[host] = detail
        if news:
            record = vanished_record(host, detail)
            log(f"{record.what}: stopping the job on every host")
            self.relay_failure(record.relayed())

    def relay_failure(self, failure: dict[str, Any], origin: _Peer | None = None) -> None:
        """The first failure only, to every host still connected but the one that posted it
        (loop thread)."""
        with self.lock:
            if self.first_failure is not None:
                return
            self.first_failure = failure
        for peer in self._open_peers():
            if peer is not origin:
                self._send(peer, {"type": "abort", "failure": failure})

    # -- for the master's main thread -------------------------------------------------------
    def post(self, failure: RankRecord) -> None:
        """Relay a failure of the master's own bootstrap (from any thread)."""
        self._posted.append(failure.relayed())
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")

    def has_joined(self, host: str) -> bool:
        with self.lock:
            return host in self.joined

    def unfinished(self) -> set[str]:
        """Hosts that joined and have not finished, left or gone silent yet."""
        with self.lock:
            return set(self.joined) - self.finished

    def missing(self) -> list[str]:
        with self.lock:
            return [h for h in self.hosts if h not in self.joined]

    def wait_finished(self, timeout: float) -> None:
        """Keep serving until every host reported done, closed its connection or went silent
        (bounded), so a relayed failure reaches every host before the master's bootstrap
        exits. A frozen host ends this wait after the liveness timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.thread.is_alive():
            with self.lock:
                if self.finished >= set(self.joined):
                    return
            time.sleep(0.1)

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")
        self.thread.join(timeout=5)
        for sock in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                sock.close()


def _detail(error: OSError, timeout: float) -> str:
    if error.errno == errno.ETIMEDOUT:  # TCP_USER_TIMEOUT: sent data went unacknowledged
        return f"no acknowledgement for {timeout:g} s"
    return (error.strerror or str(error)).lower()  # "connection reset by peer"


def _words(failure: RankRecord) -> str:
    """A relayed failure as one phrase naming its host (as failure.describe_rank does, which
    this module does not import: it would pull in the whole plan)."""
    if failure.rank is not None:
        return f"rank {failure.rank} on {failure.host} failed (exit code {failure.returncode})"
    what = failure.what or f"exit code {failure.returncode}"
    named = failure.host is None or re.search(
        rf"(?<![\w.-]){re.escape(failure.host)}(?![\w-])", what
    )
    return what if named else f"{failure.host}: {what}"


class PeerFailure(NetworkError):
    """Another host failed, or the master gave up, before this host started any worker."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Member:
    """Runs in every host's bootstrap (the master's too): joins, hears aborts, posts failures,
    and watches the master's heartbeat while sending its own."""

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
    ) -> None:
        self.host = host
        self.machine = machine  # this kernel's boot id
        self.workers = workers
        self.machines: dict[str, list[int]] = {}  # from the master's start: boot id -> tally
        self.master = master
        self.port = port
        self.liveness_timeout = liveness_timeout
        self.interval = interval
        self.sock: socket.socket | None = None
        self.started = threading.Event()
        self.abort: RankRecord | None = None  # the failure another host relayed
        self.lost_master = False  # the master's bootstrap went away before we finished
        self.lost_reason: str | None = None  # how: "no heartbeat for 10 s", "closed", ...
        self.aborted = threading.Event()  # either of the two
        self.finished = False
        self.posted = False  # this host told the others why it failed
        self.waiting_for: list[str] = []  # hosts the master still waited for at its last beat
        self.waiting_count = 0
        self.heard = 0.0
        self.idle: Callable[[], float] | None = None  # set while this host's job runs
        self._send_lock = threading.Lock()

    def join(self, timeout: float, *, verdict_grace: float = 0.0) -> None:
        """Connect (retrying), then wait until the master says every host joined. A member
        gives the master `verdict_grace` seconds more than its own timeout, so the master's
        verdict (which host never joined) arrives before a member gives up on its own."""
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
            sock.settimeout(min(self.interval, 0.5))  # the listener's tick; bounds sends too
            self.sock = sock
        self.heard = time.monotonic()
        deadline = max(deadline, self.heard + timeout) + verdict_grace
        self._send(
            {"type": "join", "host": self.host, "machine": self.machine, "workers": self.workers}
        )
        threading.Thread(target=self._listen, daemon=True, name="side-channel").start()
        while not self.started.is_set():
            if self.aborted.is_set():
                if self.lost_master:
                    raise NetworkError(
                        f"the master host {self.master} {self._lost_words()} during the join"
                    )
                raise self._failure_before_start()
            if time.monotonic() >= deadline:
                raise NetworkError(self._join_timeout_text(timeout))
            self.started.wait(0.1)

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
            f"{_words(failure)}; {self.host} started no worker because of it",
            failure.returncode or 1,
        )

    def _listen(self) -> None:
        sock = self.sock
        assert sock is not None
        inbox = b""
        last_sent = time.monotonic()
        reason = "closed"
        while not self.finished:
            now = time.monotonic()
            if now - last_sent >= self.interval:
                idle = self.idle
                self._send({"type": "beat", "idle": idle() if idle else None})
                last_sent = now
            if now - self.heard > self.liveness_timeout:
                reason = f"no heartbeat for {self.liveness_timeout:g} s"
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError as error:
                if error.errno is None:  # our own tick, not the kernel's ETIMEDOUT
                    continue
                reason = _detail(error, self.liveness_timeout)
                break
            except OSError as error:
                reason = _detail(error, self.liveness_timeout)
                break
            if not chunk:
                break
            self.heard = time.monotonic()
            messages, inbox = _split(inbox + chunk)
            for message in messages:
                self._handle(message)
        if not self.finished and not self.aborted.is_set():
            self.lost_master = True
            self.lost_reason = reason
            log(f"the master host {self.master} {self._lost_words()}: stopping this host")
            self.aborted.set()
        if not self.finished:  # a silent master gets no more of our beats
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "start":
            self.machines = dict(message.get("machines") or {})
            self.started.set()
        elif kind == "abort":
            self.abort = RankRecord.from_json(message.get("failure") or {"host": None})
            self.aborted.set()
        elif kind == "beat" and "waiting" in message:
            self.waiting_for = [str(h) for h in message.get("waiting") or []]
            self.waiting_count = int(message.get("waiting_count") or 0)

    def _send(self, message: dict[str, Any]) -> None:
        if self.sock is None:
            return
        with self._send_lock, contextlib.suppress(OSError):
            self.sock.sendall(_encode(message))

    def machine_share(self) -> tuple[int, int]:
        """(hosts, workers) of this job on this host's machine, as the master counted them."""
        hosts, workers = self.machines.get(self.machine or "", [1, self.workers])
        return int(hosts), int(workers)

    def post_failure(self, failure: RankRecord) -> None:
        """Tell the others why this host failed; once, and never to echo another's failure."""
        if self.posted or self.aborted.is_set():
            return
        self.posted = True
        self._send({"type": "failed", "failure": failure.relayed()})

    def done(self) -> None:
        self.finished = True
        self._send({"type": "done", "host": self.host})

    def close(self) -> None:
        self.finished = True
        if self.sock is not None:
            # shutdown() sends the FIN even while the listener thread sits in recv(); a bare
            # close() leaves the master waiting for this host until its timeout
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self.sock.close()
