"""Liveness of the side channel (docs/liveness.md): both ends send a heartbeat every
`HEARTBEAT_INTERVAL` seconds and watch what they hear, looking every `CHECK_INTERVAL`. A host
whose bootstrap is killed closes its connection (the kernel sends the FIN): noticed at once.
One that froze or lost the network says nothing: noticed once nothing came for
`LIVENESS_TIMEOUT` seconds (TCP's user timeout ends the connection at the same bound where sent
data goes unacknowledged). Bound: a vanished host is noticed by every other host within
LIVENESS_TIMEOUT + CHECK_INTERVAL + the relay, under 6 s; a host frozen for 3 s and resumed
(its beats held for 3 s and a beat's interval) is not.

A watcher that is itself held up (its process frozen, starved of CPU, swapped out) would find
every peer silent when it runs again: its silence is counted on its own clock (`Lived`), which
leaves out whatever a watcher's wait overran by more than a beat's interval.

Here: the timing, the kernel's part (`tune`), the watcher's clock, the words for how a
connection ended, and the master's watch (`Liveness`): who went silent, and the hang
watchdog's verdict from the idle times the heartbeats carry."""

from __future__ import annotations

import contextlib
import errno
import socket
import time
from collections.abc import Sequence

from container_entry.common.exits import ExitCode
from container_entry.common.records import RankRecord
from container_entry.diagnose.failure import hung_words, vanished_words
from container_entry.diagnose.hang import Silence
from container_entry.hosts.messages import MemberBeat
from container_entry.hosts.peer import Peer

HEARTBEAT_INTERVAL = 1.0  # seconds between heartbeats, both ways
LIVENESS_TIMEOUT = 5.0  # seconds of silence after which a peer is gone (TorchFT's lighthouse: 5)
CHECK_INTERVAL = 0.25  # how often each end looks for silence
# a member waits this much longer than the master for every host to join, so the master's word
# on which host never joined reaches it before it gives up on its own
JOIN_VERDICT_GRACE = LIVENESS_TIMEOUT + 5.0


class Lived:
    """A watcher's own time: monotonic, less each overrun of its waits. The watcher looks at
    least every `slack` seconds when it runs; a longer gap between two looks is time it did not
    run (its process frozen, starved, swapped out), and its peers' beats waited in the kernel
    meanwhile: nobody's silence. One thread's clock."""

    def __init__(self, slack: float) -> None:
        self.slack = slack
        self.last = time.monotonic()
        self.excused = 0.0

    def now(self) -> float:
        real = time.monotonic()
        gap = real - self.last
        if gap > self.slack:
            self.excused += gap - self.slack
        self.last = real
        return real - self.excused


def watcher_slack(timeout: float) -> float:
    """The longest a watcher's look may come late before the rest counts as its own stall: a
    beat's interval, and never more than a fifth of the liveness timeout."""
    return min(HEARTBEAT_INTERVAL, timeout / 5)


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


def detail(error: OSError, timeout: float) -> str:
    """How a connection ended, in words: "connection reset by peer", "no acknowledgement..."."""
    if error.errno == errno.ETIMEDOUT:  # TCP_USER_TIMEOUT: sent data went unacknowledged
        return f"no acknowledgement for {timeout:g} s"
    return (error.strerror or str(error)).lower()


def silence(timeout: float) -> str:
    """The detail of a peer gone silent."""
    return f"no heartbeat for {timeout:g} s"


def vanished_record(host: str, detail: str) -> RankRecord:
    """A host that left without a word, as the job's failure. It has no exit code of its own:
    the others exit FAILED, as for a lost master."""
    return RankRecord(
        host=host, rank=None, returncode=ExitCode.FAILED, what=vanished_words(host, detail)
    )


class Liveness:
    """The master's watch over its connections: a peer silent for `timeout` is gone; each
    host's beats give its ranks' idle time and its clock's skew; the job hung when every host
    still running its job has been idle longer than the hang timeout allows (`hang.Silence`:
    HANG_TIMEOUT's seconds, 0 none, None auto)."""

    def __init__(self, timeout: float, hang_timeout: float | None, hosts: int) -> None:
        self.timeout = timeout
        self.silence = Silence(hang_timeout)
        self.hosts = hosts

    def silent(self, peer: Peer, now: float) -> str | None:
        """Why the peer is gone (the detail), if nothing came from it for the timeout."""
        return silence(self.timeout) if now - peer.heard > self.timeout else None

    def heard(self, peer: Peer, beat: MemberBeat) -> None:
        """A host's heartbeat: its idle time, and its clock (the smallest skew seen is the
        closest to the truth: the beat's way here only adds to it)."""
        peer.idle = beat["idle"]
        sent = beat["time"]
        if sent is not None:
            skew = time.time() - sent
            peer.skew = skew if peer.skew is None else min(peer.skew, skew)

    def hung(self, hosts: Sequence[Peer]) -> RankRecord | None:
        """The hang verdict, if every host still running its job has had no output from any
        rank for the hang timeout (a host still preparing, or done, is no evidence)."""
        running = [p for p in hosts if not p.said_done]
        idle = [p.idle for p in running]
        if not running or any(i is None for i in idle):
            return None
        if not self.silence.hung(min(i for i in idle if i is not None)):
            return None
        what = hung_words(self.silence.timeout(), self.hosts)
        return RankRecord(host=None, rank=None, returncode=ExitCode.HUNG, what=what)
