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

Trust: the master listens on every interface, so anything in the job's subnets can connect.
Only the job's own hosts take part (challenge-response, the key never sent):

  master -> {"type": "hello", "version": 1, "nonce": N}              at once, to every connection
  member -> {"type": "join", "host", "machine", "workers", "nonce": M,
             "proof": HMAC(key, join, N, M, host, machine, workers)}
  master -> {"type": "welcome", "proof": HMAC(key, welcome, M, N, host)}    once admitted

The key is `job_key`: every host derives the same one from job facts a machine in the VPC cannot
read (or it is CONTAINER_ENTRY_JOB_SECRET). The master admits a join only with a good proof,
for a host of the job not yet joined, from an address that host's name resolves to; until then
nothing the connection says is acted on, and one that has not joined within `AUTH_TIMEOUT` is
dropped. A member acts on nothing from the master before a good welcome. Every message is
checked against its schema (known fields, types, bounded strings and numbers; a line at most
`LINE_LIMIT` bytes); a host speaks only for itself. A refused connection is closed and logged
(one line naming its address and why, rate-limited) without touching any other.

The master serves every host from one thread (a selector loop), so its cost stays flat in the
number of hosts; a host that stops reading can never block it. Name lookups for the address
check run on short-lived threads (at most `_LOOKUPS` at once) so a slow resolver never holds
the loop. Newline-delimited JSON; stdlib.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import math
import os
import re
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from container_entry.errors import ConfigError, NetworkError
from container_entry.exits import ExitCode
from container_entry.hang import hung_text
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

PROTOCOL = 1
AUTH_TIMEOUT = 5.0  # seconds a new connection has to send a proven join
ADDRESS_WAIT = 30.0  # seconds a proven join may wait for its host name to resolve (retried)
LINE_LIMIT = 64 * 1024  # bytes in one line to the master (or pending without a newline)
MEMBER_LINE_LIMIT = 1 << 20  # to a member (the start's machine map grows with the hosts)
MAX_UNJOINED = 128  # connections still to join at once; the oldest goes first
TEXT_CAP = 2000  # characters of a failure's free text (what, exception message, ...)
NAME_CAP = 253  # characters of a host name (DNS), a boot id, an exception's type
_LOOKUPS = 8  # name lookups at once for the address check
_HELD = 32  # messages a proven host may send while its address is checked

JOB_SECRET_ENV = "CONTAINER_ENTRY_JOB_SECRET"
MIN_SECRET_LENGTH = 16
# host-independent facts of a SageMaker job a machine in its subnets cannot read (with the
# config files' contents). Not the credentials URI: nothing says it is the same on every host,
# and a fact that differs between hosts would refuse every host of every multi-host job.
KEY_ENV = ("TRAINING_JOB_NAME", "TRAINING_JOB_ARN")
# a torchrun-style cluster's (no SageMaker files): the same on every node by construction
KEY_ENV_TORCHRUN = (
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NNODES",
    "PET_RDZV_ID",
    "PET_RDZV_ENDPOINT",
    "MASTER_PORT",
    "WORLD_SIZE",
)


# -- the key and the proofs -----------------------------------------------------------------


def job_key(
    environ: Mapping[str, str],
    resource_config: Mapping[str, Any] | None,
    hyperparameters: Mapping[str, Any],
    input_data_config: Mapping[str, Any],
) -> bytes:
    """The side channel's key, the same on every host of one job (pure).

    CONTAINER_ENTRY_JOB_SECRET, when set, is the key (at least MIN_SECRET_LENGTH characters).
    Otherwise a digest of what SageMaker gives every host of the job alike and a machine in the
    job's subnets cannot read: the host list and instance groups of resourceconfig.json (not
    its host-specific fields), hyperparameters.json, inputdataconfig.json, the job's name and
    ARN, and the container-credentials URI where set. Outside SageMaker: the torchrun
    variables (PET_*, MASTER_PORT, WORLD_SIZE). Raises ConfigError for a short secret."""
    import hashlib  # here and in _mac: OpenSSL (5 MB) only in a job of several hosts

    secret = environ.get(JOB_SECRET_ENV)
    if secret is not None:
        if len(secret) < MIN_SECRET_LENGTH:
            raise ConfigError(
                f"{JOB_SECRET_ENV} is {len(secret)} characters: use at least "
                f"{MIN_SECRET_LENGTH} (the same random value on every host)"
            )
        return hashlib.sha256(b"container-entry job secret v1\0" + secret.encode()).digest()
    facts: dict[str, Any]
    if resource_config is not None:
        groups = resource_config.get("instance_groups") or []
        facts = {
            "hosts": sorted(str(h) for h in resource_config.get("hosts") or []),
            "instance_groups": sorted(
                (
                    [
                        str(g.get("instance_group_name")),
                        str(g.get("instance_type")),
                        sorted(str(h) for h in g.get("hosts") or []),
                    ]
                    for g in groups
                    if isinstance(g, Mapping)
                ),
                key=json.dumps,
            ),
            "hyperparameters": hyperparameters,
            "input_data_config": input_data_config,
            "environ": {name: environ.get(name) for name in KEY_ENV},
        }
    else:
        facts = {"torchrun": {name: environ.get(name) for name in KEY_ENV_TORCHRUN}}
    canonical = json.dumps(facts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(b"container-entry job key v1\0" + canonical.encode()).digest()


def _mac(key: bytes, *parts: object) -> str:
    import hashlib
    import hmac

    text = "\0".join(["container-entry side channel v1", *(str(p) for p in parts)])
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def _same(expected: str, given: str) -> bool:
    """Whether a proof is the expected one, in constant time."""
    import hmac

    return hmac.compare_digest(expected, given)


def join_proof(
    key: bytes, nonce: str, member_nonce: str, host: str, machine: str | None, workers: int
) -> str:
    """A member's proof that it holds the key, bound to the master's challenge and its join."""
    return _mac(key, "join", nonce, member_nonce, host, machine or "", workers)


def welcome_proof(key: bytes, member_nonce: str, nonce: str, host: str) -> str:
    """The master's proof to the member that it holds the key too."""
    return _mac(key, "welcome", member_nonce, nonce, host)


def _nonce() -> str:
    return os.urandom(32).hex()  # as secrets.token_hex, without importing random


# -- framing and schemas --------------------------------------------------------------------


class Invalid(ValueError):
    """A line or message that does not follow the protocol; the text says how."""


class _Lines:
    """Complete lines out of a stream, each at most `limit` bytes. Only new data is searched
    for a newline (no rescan of what is pending). A line over the limit comes out as an
    Invalid in its place; so does pending data over it, and the rest of that line is skipped
    as it arrives (never kept)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.skipping = False

    def feed(self, chunk: bytes) -> list[bytes | Invalid]:
        items: list[bytes | Invalid] = []
        if self.skipping:
            end = chunk.find(b"\n")
            if end < 0:
                return items
            self.skipping = False
            chunk = chunk[end + 1 :]
        searched = len(self.buffer)
        self.buffer += chunk
        begin = 0
        while (end := self.buffer.find(b"\n", searched)) >= 0:
            if end - begin > self.limit:
                items.append(Invalid(f"a line over {_size(self.limit)}"))
            else:
                items.append(bytes(self.buffer[begin:end]))
            begin = searched = end + 1
        del self.buffer[:begin]
        if len(self.buffer) > self.limit:
            self.buffer.clear()
            self.skipping = True
            items.append(Invalid(f"a line over {_size(self.limit)}"))
        return items


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"


def _no_constant(name: str) -> Any:
    raise Invalid(f"not JSON ({name} is not a number)")


def parse(line: bytes) -> dict[str, Any]:
    """One line as a JSON object; Invalid for anything else, however deeply it nests."""
    try:
        message = json.loads(line, parse_constant=_no_constant)
    except Invalid:
        raise
    except RecursionError:
        raise Invalid("not JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError):
        raise Invalid("not JSON") from None
    if not isinstance(message, dict):
        raise Invalid(f"not a JSON object but {type(message).__name__}")
    return message


def _fields(message: Mapping[str, Any], required: Iterable[str], optional: Iterable[str] = ()):
    kind = message.get("type")
    allowed = {"type", *required, *optional}
    unknown = sorted(repr(str(k)[:40]) for k in message if k not in allowed)
    if unknown:
        raise Invalid(f"{kind} with unknown field(s) {', '.join(unknown[:4])}")
    missing = [name for name in required if name not in message]
    if missing:
        raise Invalid(f"{kind} without {', '.join(missing)}")


def _text(value: Any, what: str, cap: int, *, none: bool = True) -> str | None:
    if value is None and none:
        return None
    if not isinstance(value, str):
        raise Invalid(f"{what} is not a string")
    if len(value) > cap:
        raise Invalid(f"{what} is longer than {cap} characters")
    return value


def _integer(value: Any, what: str, low: int, high: int, *, none: bool = False) -> int | None:
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise Invalid(f"{what} is not an integer")
    if not low <= value <= high:
        raise Invalid(f"{what} is not between {low} and {high}")
    return value


def _number(value: Any, what: str, low: float, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Invalid(f"{what} is not a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise Invalid(f"{what} is not a finite number between {low:g} and {high:g}")
    return float(value)


_HEX = re.compile(r"[0-9a-f]{64}")


def _hex(value: Any, what: str) -> str:
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise Invalid(f"{what} is not 64 hex digits")
    return value


_RECORD_TEXT = ("what", "last_words", "fatal_error", "summary")
_RECORD_NAMES = ("signal", "stop_signal", "stage")
_RECORD_FIELDS = frozenset(RankRecord(host=None, rank=None).relayed())


def failure_record(value: Any) -> dict[str, Any]:
    """A relayed failure (RankRecord.relayed()) checked field by field."""
    if not isinstance(value, dict):
        raise Invalid("failure is not an object")
    unknown = sorted(repr(str(k)[:40]) for k in value if k not in _RECORD_FIELDS)
    if unknown:
        raise Invalid(f"failure with unknown field(s) {', '.join(unknown[:4])}")
    record: dict[str, Any] = {}
    for name, item in value.items():
        if name == "host":
            record[name] = _text(item, "failure host", NAME_CAP)
        elif name in ("rank", "local_rank"):
            record[name] = _integer(item, f"failure {name}", 0, 2**31, none=True)
        elif name == "returncode":
            record[name] = _integer(item, "failure returncode", -255, 255)
        elif name == "restart_count":
            record[name] = _integer(item, "failure restart_count", 0, 10**9)
        elif name in _RECORD_NAMES:
            record[name] = _text(item, f"failure {name}", 64)
        elif name in _RECORD_TEXT:
            record[name] = _text(item, f"failure {name}", TEXT_CAP)
        elif name == "ended_at":
            record[name] = _number(item, "failure ended_at", 0, 1e11)
        elif name == "exception":
            record[name] = _exception(item)
        else:  # a field added to RankRecord later: a plain, bounded value
            record[name] = _plain(item, f"failure {name}")
    return record


def _plain(value: Any, what: str) -> str | int | float | None:
    if value is None or isinstance(value, str):
        return _text(value, what, TEXT_CAP)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return _integer(value, what, -(2**53), 2**53)
    if isinstance(value, float):
        return _number(value, what, -1e300, 1e300)
    raise Invalid(f"{what} is not a string or a number")


def _exception(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"type", "message"}:
        raise Invalid("failure exception is not {type, message}")
    exception = {}
    for name, cap in (("type", NAME_CAP), ("message", TEXT_CAP)):
        if name in value:
            exception[name] = _text(value[name], f"failure exception {name}", cap, none=False)
    return exception


def fitted(record: dict[str, Any]) -> dict[str, Any]:
    """A failure of this host cut to what the schema allows (free text shortened), so that
    what a member posts always passes the master's checks."""
    record = dict(record)
    for name in _RECORD_TEXT:
        if isinstance(record.get(name), str):
            record[name] = record[name][:TEXT_CAP]
    for name in _RECORD_NAMES:
        if isinstance(record.get(name), str):
            record[name] = record[name][:64]
    exception = record.get("exception")
    if isinstance(exception, dict):
        record["exception"] = {
            k: str(v)[: NAME_CAP if k == "type" else TEXT_CAP]
            for k, v in exception.items()
            if k in ("type", "message")
        }
    # escaped, non-ASCII text may still make the line too long: halve the longest text
    while len(_encode({"type": "failed", "failure": record})) > LINE_LIMIT:
        texts = [(len(record[n]), n) for n in _RECORD_TEXT if isinstance(record.get(n), str)]
        message = (record.get("exception") or {}).get("message")
        if isinstance(message, str):
            texts.append((len(message), "exception"))
        if not texts:
            break
        length, name = max(texts)
        if name == "exception":
            record["exception"] = {**record["exception"], "message": message[: length // 2]}
        else:
            record[name] = record[name][: length // 2]
    return record


def to_master(message: dict[str, Any]) -> dict[str, Any]:
    """A message from a member, checked against its schema (Invalid says what is wrong)."""
    kind = message.get("type")
    if kind == "join":
        _fields(message, ("host", "machine", "workers", "nonce", "proof"))
        _text(message["host"], "join host", NAME_CAP, none=False)
        _text(message["machine"], "join machine", NAME_CAP)
        _integer(message["workers"], "join workers", 0, 1 << 20)
        _hex(message["nonce"], "join nonce")
        _hex(message["proof"], "join proof")
        return message
    if kind == "beat":
        _fields(message, (), ("idle", "time"))
        idle = _number(message.get("idle"), "beat idle", 0, 1e12)
        sent = _number(message.get("time"), "beat time", 0, 1e12)
        return {"type": "beat", "idle": idle, "time": sent}
    if kind == "failed":
        _fields(message, ("failure",))
        return {"type": "failed", "failure": failure_record(message["failure"])}
    if kind == "done":
        _fields(message, (), ("host",))
        _text(message.get("host"), "done host", NAME_CAP)
        return message
    raise Invalid(f"unknown message type {str(kind)[:40]!r}")


def to_member(message: dict[str, Any]) -> dict[str, Any]:
    """A message from the master, checked against its schema."""
    kind = message.get("type")
    if kind == "hello":
        _fields(message, ("version", "nonce"))
        _integer(message["version"], "hello version", 0, 1 << 30)
        _hex(message["nonce"], "hello nonce")
        return message
    if kind == "welcome":
        _fields(message, ("proof",))
        _hex(message["proof"], "welcome proof")
        return message
    if kind == "refused":
        _fields(message, ("reason",))
        _text(message["reason"], "refusal reason", 200, none=False)
        return message
    if kind == "start":
        _fields(message, ("machines",))
        machines = message["machines"]
        if not isinstance(machines, dict):
            raise Invalid("start machines is not an object")
        for machine, tally in machines.items():
            _text(machine, "start machine", NAME_CAP, none=False)
            if not isinstance(tally, list) or len(tally) != 2:
                raise Invalid("start machine tally is not [hosts, workers]")
            for count in tally:
                _integer(count, "start machine tally", 0, 1 << 30)
        return message
    if kind in ("abort", "first"):
        _fields(message, ("failure",))
        return {"type": kind, "failure": failure_record(message["failure"])}
    if kind == "beat":
        _fields(message, (), ("waiting", "waiting_count"))
        waiting = message.get("waiting")
        if waiting is not None:
            if not isinstance(waiting, list) or len(waiting) > _WAITING_NAMES:
                raise Invalid(f"beat waiting is not a list of at most {_WAITING_NAMES} names")
            for name in waiting:
                _text(name, "beat waiting name", NAME_CAP, none=False)
        _integer(message.get("waiting_count", 0), "beat waiting_count", 0, 1 << 30)
        return message
    raise Invalid(f"unknown message type {str(kind)[:40]!r}")


def address_matches(address: str, resolved: Iterable[str]) -> bool:
    """Whether a peer's address is one its claimed host name resolves to. Loopback counts for
    loopback: a name that resolves to this machine (127.0.1.1, ::1) may connect from any
    loopback address, since only this machine can send from one."""
    try:
        peer = _ip(address)
    except ValueError:
        return False
    names = set()
    for item in resolved:
        with contextlib.suppress(ValueError):
            names.add(_ip(item))
    return peer in names or (peer.is_loopback and any(ip.is_loopback for ip in names))


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    ip = ipaddress.ip_address(text.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


class _Quota:
    """Log lines about misbehaving peers: `burst` at once, then one per `every` seconds; what
    is held back is counted and said with the next line, so a flood cannot fill the log."""

    def __init__(self, burst: int = 10, every: float = 6.0) -> None:
        self.burst, self.every = burst, every
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.held = 0

    def log(self, text: str) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) / self.every)
        self.stamp = now
        if self.tokens < 1:
            self.held += 1
            return
        self.tokens -= 1
        if self.held:
            text += f" ({self.held} more side-channel line(s) since were not logged)"
            self.held = 0
        log(f"side channel: {text}")


def _encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message) + "\n").encode()


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


# -- the master -----------------------------------------------------------------------------

_NEW, _CHECKING, _JOINED, _CLOSING = "new", "checking", "joined", "closing"
_LINGER = 2.0  # seconds a refused join is read (and ignored) until it closes


class _Peer:
    """One connection at the master: a stranger until it joined with a good proof from an
    address of the host it names."""

    def __init__(self, sock: socket.socket, address: tuple[Any, ...], now: float) -> None:
        self.sock = sock
        self.ip = str(address[0])
        self.address = f"{address[0]}:{address[1]}"
        self.state = _NEW
        self.nonce = _nonce()  # the master's challenge to it
        self.member_nonce = ""  # its challenge to the master
        self.host: str | None = None
        self.lines = _Lines(LINE_LIMIT)
        self.outbox = bytearray()
        self.since = now  # accepted
        self.heard = now  # the last time anything arrived
        self.said_done = False
        self.posted = False  # it posted a failure: its leaving is no news
        self.open = True
        self.machine: str | None = None  # its kernel's boot id, as it said at the join
        self.workers = 0
        self.idle: float | None = None  # its ranks' silence at its last beat; None: no job yet
        # the master's clock minus the host's, plus the beat's way here: the smallest seen
        self.skew: float | None = None
        self.held: list[dict[str, Any]] = []  # what it said while its address was checked
        self.lookup_due: float | None = None  # when to look its name up again
        self.lookups = 0

    @property
    def name(self) -> str:
        return f"{self.host} ({self.address})" if self.host else self.address


class _Lookups:
    """Host-name lookups off the loop thread, at most `parallel` at once on daemon threads that
    end when nothing is left to look up; each result goes to `deliver`."""

    def __init__(
        self,
        resolve: Callable[[str], Iterable[str]],
        deliver: Callable[[str, frozenset[str], str | None], None],
        parallel: int = _LOOKUPS,
    ) -> None:
        self.resolve, self.deliver, self.parallel = resolve, deliver, parallel
        self.queue: deque[str] = deque()
        self.lock = threading.Lock()
        self.running = 0

    def submit(self, host: str) -> None:
        with self.lock:
            self.queue.append(host)
            if self.running >= self.parallel:
                return
            self.running += 1
        threading.Thread(target=self._work, daemon=True, name="side-channel-lookup").start()

    def _work(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.running -= 1
                    return
                host = self.queue.popleft()
            try:
                found, error = frozenset(self.resolve(host)), None
            except Exception as failure:  # a name that does not resolve (yet)
                found, error = frozenset(), str(failure) or type(failure).__name__
            with contextlib.suppress(Exception):
                self.deliver(host, found, error)


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
        hang_timeout: float = 0.0,
        key: bytes = b"",
        resolve: Callable[[str], Iterable[str]] | None = None,
        auth_timeout: float = AUTH_TIMEOUT,
        address_wait: float = ADDRESS_WAIT,
    ) -> None:
        self.hosts = tuple(hosts)
        self.liveness_timeout = liveness_timeout
        self.hang_timeout = hang_timeout  # 0: no hang watchdog
        self.interval = interval
        self.key = key
        self.auth_timeout = auth_timeout
        self.address_wait = address_wait
        self.joined: dict[str, _Peer] = {}
        self.finished: set[str] = set()
        self.vanished: dict[str, str] = {}  # host -> what happened
        self.refused: list[tuple[str, str]] = []  # (peer address, why), the latest 100
        self.first_failure: dict[str, Any] | None = None
        self._first_skew: float | None = None  # its poster's clock, as _earlier needs it
        self.started = False
        self.lock = threading.Lock()  # guards the state above against readers' threads
        self.quota = _Quota()
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
        self.server.listen(len(self.hosts) + MAX_UNJOINED)
        self.server.setblocking(False)
        self._closing = False
        self._posted: list[dict[str, Any]] = []  # failures the master's own threads posted
        self._found: list[tuple[str, frozenset[str], str | None]] = []  # lookups' results
        self._unjoined: dict[_Peer, None] = {}  # connections yet to join, oldest first
        self._lingering: dict[_Peer, None] = {}  # refused joins, read until they close
        self._looking_up: set[str] = set()
        self._lookups = _Lookups(resolve, self._deliver) if resolve else None
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
                    try:
                        self._event(key.data, mask)
                    except Exception as error:  # one peer's trouble is that peer's alone
                        self._defect(key.data, error)
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

    def _event(self, data: Any, mask: int) -> None:
        if data == "accept":
            self._accept()
        elif data == "wake":
            with contextlib.suppress(OSError):
                self._wake_read.recv(4096)
            while self._posted:
                self.relay_failure(self._posted.pop(0))
            while self._found:
                self._looked_up(*self._found.pop(0))
        elif data.open:  # not dropped earlier in this batch
            peer: _Peer = data
            if mask & selectors.EVENT_READ:
                self._read(peer)
            if peer.open and mask & selectors.EVENT_WRITE:
                self._flush(peer)

    def _defect(self, data: Any, error: Exception) -> None:
        """A defect of ours while serving one peer: said, and that peer alone pays (a stranger
        is dropped; a host keeps its connection, losing the message)."""
        what = f"{type(error).__name__}: {error}"
        if isinstance(data, _Peer):
            self.quota.log(f"internal error serving {data.name}: {what}")
            if data.state != _JOINED:
                self._drop(data)
        else:
            self.quota.log(f"internal error: {what}")

    def _accept(self) -> None:
        while True:
            try:
                connection, address = self.server.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            with contextlib.suppress(OSError):
                tune(connection, self.liveness_timeout)
            connection.setblocking(False)
            peer = _Peer(connection, address, time.monotonic())
            self.selector.register(connection, selectors.EVENT_READ, peer)
            self._unjoined[peer] = None
            self._send(peer, {"type": "hello", "version": PROTOCOL, "nonce": peer.nonce})
            waiting = [p for p in self._unjoined if p.state == _NEW]
            if len(waiting) > MAX_UNJOINED:
                self._refuse(waiting[0], "too many connections waiting to join")

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
        if peer.state == _CLOSING:  # refused: read only to close cleanly
            return
        peer.heard = time.monotonic()
        for item in peer.lines.feed(chunk):
            if not peer.open or peer.state == _CLOSING:  # refused: the rest goes unread
                return
            try:
                if isinstance(item, Invalid):
                    raise item
                message = parse(item)
                if peer.state == _NEW and message.get("type") != "join":
                    kind = str(message.get("type"))[:40]
                    raise Invalid(f"not a host of this job: {kind!r} before a join")
                message = to_master(message)
            except Invalid as error:
                self._misbehaved(peer, str(error))
                continue
            self._handle(peer, message)

    def _misbehaved(self, peer: _Peer, why: str) -> None:
        """A stranger is refused; a host of the job loses that message only."""
        if peer.state == _JOINED:
            self.quota.log(f"ignored a message from {peer.name}: {why}")
        else:
            self._refuse(peer, why)

    def _refuse(self, peer: _Peer, why: str, detail: str = "", *, linger: bool = False) -> None:
        """Close a connection that is not (yet) a host of the job, telling it and the log why;
        nothing else changes. A well-formed join refused (a host with another key, from an
        unexpected address) lingers up to `_LINGER` s, reading and discarding, so the refusal
        reaches it: a close with its beats unread would reset the connection, and the reset
        would take the refusal with it."""
        self.quota.log(f"refused {peer.address} ({why}{detail})")
        self.refused = [*self.refused[-99:], (peer.address, why + detail)]
        if peer.open and not peer.outbox:  # never half a line after another
            with contextlib.suppress(OSError):
                peer.sock.send(_encode({"type": "refused", "reason": why[:200]}))
                if linger and len(self._lingering) < MAX_UNJOINED:
                    peer.sock.shutdown(socket.SHUT_WR)
                    self._unjoined.pop(peer, None)
                    self._lingering[peer] = None
                    peer.state = _CLOSING
                    peer.since = time.monotonic()
                    return
        self._drop(peer)

    def _handle(self, peer: _Peer, message: dict[str, Any]) -> None:
        kind = message["type"]
        if peer.state == _NEW:  # a join: anything else was refused unread
            self._join(peer, message)
        elif peer.state == _CHECKING:  # proven; held until its address is checked
            if kind == "beat":
                peer.held = [m for m in peer.held if m["type"] != "beat"]
            if kind != "join" and len(peer.held) < _HELD:
                peer.held.append(message)
        elif peer.state != _JOINED:  # refused: nothing it says counts
            return
        elif kind == "join":
            self.quota.log(f"ignored a second join from {peer.name}")
        elif kind == "failed":
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
        elif kind == "beat":
            peer.idle = message["idle"]
            if message.get("time") is not None:
                skew = time.time() - message["time"]
                peer.skew = skew if peer.skew is None else min(peer.skew, skew)
        elif kind == "done":
            if message.get("host") not in (None, peer.host):
                self.quota.log(f"ignored 'done' from {peer.name} for another host")
                return
            peer.said_done = True
            with self.lock:
                self.finished.add(peer.host)

    def _join(self, peer: _Peer, message: dict[str, Any]) -> None:
        host = message["host"]
        if host not in self.hosts:
            self._refuse(
                peer, "not a host of this job: unknown host name", f" {host[:60]!r}", linger=True
            )
            return
        expected = join_proof(
            self.key, peer.nonce, message["nonce"], host, message["machine"], message["workers"]
        )
        if not _same(expected, message["proof"]):
            self._refuse(peer, "not a host of this job: bad proof", f", claims {host}", linger=True)
            return
        if self._taken(host):
            self._refuse(peer, f"{host} already joined", linger=True)
            return
        peer.host = host
        peer.member_nonce = message["nonce"]
        peer.machine = message["machine"]
        peer.workers = message["workers"]
        peer.state = _CHECKING
        if self._lookups is None:
            self._admit(peer)
        else:
            self._look_up(host)

    def _taken(self, host: str) -> bool:
        """A host joins once: members never join again, so a second join is not the host's."""
        with self.lock:
            return host in self.joined

    # -- the address check ------------------------------------------------------------------
    def _look_up(self, host: str) -> None:
        if self._lookups is not None and host not in self._looking_up:
            self._looking_up.add(host)
            self._lookups.submit(host)

    def _deliver(self, host: str, found: frozenset[str], error: str | None) -> None:
        """From a lookup thread: hand the result to the loop."""
        self._found.append((host, found, error))
        with contextlib.suppress(OSError):
            self._wake_write.send(b"\0")

    def _looked_up(self, host: str, found: frozenset[str], error: str | None) -> None:
        self._looking_up.discard(host)
        now = time.monotonic()
        for peer in [p for p in self._unjoined if p.state == _CHECKING and p.host == host]:
            if not peer.open:
                continue
            if address_matches(peer.ip, found):
                self._admit(peer)
            elif found:
                self._refuse(
                    peer,
                    "not a host of this job: address mismatch",
                    f", claims {host}, which resolves to {', '.join(sorted(found)[:4])}",
                    linger=True,
                )
            elif now - peer.since >= self.address_wait:
                self._refuse(
                    peer,
                    "not a host of this job: address unknown",
                    f", claims {host}, which did not resolve within {self.address_wait:g} s "
                    f"({error})",
                    linger=True,
                )
            else:  # DNS may lag at the start: ask again soon
                peer.lookup_due = now + backoff(peer.lookups, 1.0)
                peer.lookups += 1

    def _admit(self, peer: _Peer) -> None:
        host = peer.host
        assert host is not None
        if self._taken(host):
            self._refuse(peer, f"{host} already joined", linger=True)
            return
        peer.state = _JOINED
        self._unjoined.pop(peer, None)
        proof = welcome_proof(self.key, peer.member_nonce, peer.nonce, host)
        self._send(peer, {"type": "welcome", "proof": proof})
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
        held, peer.held = peer.held, []
        for message in held:
            if peer.open:
                self._handle(peer, message)

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
        """Heartbeats out; anyone silent for the liveness timeout is gone; a connection that
        has not joined in time is refused."""
        now = time.monotonic()
        beat: dict[str, Any] = {"type": "beat"}
        if not self.started:
            waiting = self.missing()
            beat.update(waiting=waiting[:_WAITING_NAMES], waiting_count=len(waiting))
        data, plain = _encode(beat), _encode({"type": "beat"})
        for key in list(self.selector.get_map().values()):
            peer = key.data
            if not isinstance(peer, _Peer) or not peer.open:
                continue
            try:
                self._tend(peer, now, data, plain)
            except Exception as error:
                self._defect(peer, error)
        if self.hang_timeout and self.first_failure is None:
            self._check_hang()

    def _tend(self, peer: _Peer, now: float, data: bytes, plain: bytes) -> None:
        if peer.state == _CLOSING:
            if now - peer.since > _LINGER:
                self._drop(peer)
            return
        if peer.state == _NEW:
            if now - peer.since > self.auth_timeout:
                self._refuse(peer, f"did not join within {self.auth_timeout:g} s")
            return
        if now - peer.heard > self.liveness_timeout:
            self._gone(peer, f"no heartbeat for {self.liveness_timeout:g} s")
        elif peer.outbox:  # a peer that stopped reading gets no pile of beats
            pass
        elif peer.state == _JOINED:
            self._queue(peer, data)
        else:  # proven, its address still being checked: only that we are here
            self._queue(peer, plain)
            host = peer.host or ""
            if peer.lookup_due is not None and now >= peer.lookup_due:
                peer.lookup_due = None
                self._look_up(host)
            elif host in self._looking_up and now - peer.since > self.address_wait + 5.0:
                self._refuse(
                    peer,
                    "not a host of this job: address unknown",
                    f", claims {host}, whose lookup did not end within {self.address_wait:g} s",
                    linger=True,
                )

    def _check_hang(self) -> None:
        """The job hung when every host still running its job has had no output from any
        rank for the hang timeout (a host still preparing, or done, is no evidence)."""
        running = [p for p in self._open_peers() if not p.said_done]
        if not running or any(p.idle is None or p.idle < self.hang_timeout for p in running):
            return
        what = hung_text(self.hang_timeout, len(self.hosts))
        log(f"{what}: stopping the job on every host")
        self.relay_failure(
            RankRecord(host=None, rank=None, returncode=ExitCode.HUNG, what=what).relayed()
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
        self._unjoined.pop(peer, None)
        self._lingering.pop(peer, None)
        if not peer.open:
            return
        peer.open = False
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(peer.sock)
        with contextlib.suppress(OSError):
            peer.sock.close()

    def _gone(self, peer: _Peer, detail: str) -> None:
        """A connection ended or went silent. For a host that neither finished nor posted a
        failure that is a failure of the job: relay it, naming the host. A connection that
        never joined is no news to anyone."""
        if peer.state in (_NEW, _CHECKING):
            self.quota.log(f"dropped {peer.name} ({detail} before it joined)")
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
        """The job's first failure, decided here for every host (loop thread). The first to
        arrive stops every other host at once (`abort`); one that arrives later but ended
        earlier, by the ranks' own clocks corrected by what the heartbeats showed of each
        host's clock, takes its place. Every change of the decision goes to every host
        (`first`), the poster included, so all write the same first line."""
        with self.lock:
            decided, first = self.first_failure, self.first_failure is None
            if not first and not _earlier(failure, _skew(origin), decided, self._first_skew):
                return
            self.first_failure, self._first_skew = failure, _skew(origin)
        for peer in self._open_peers():
            if first and peer is not origin:
                self._send(peer, {"type": "abort", "failure": failure})
            self._send(peer, {"type": "first", "failure": failure})

    # -- for the master's main thread -------------------------------------------------------
    def post(self, failure: RankRecord) -> None:
        """Relay a failure of the master's own bootstrap (from any thread)."""
        self._posted.append(fitted(failure.relayed()))
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


CLOCK_TOLERANCE = 5.0  # seconds: a host whose clock seems further off is ordered by arrival


def _skew(peer: _Peer | None) -> float | None:
    """How far a poster's clock is behind the master's (0 for the master's own posts)."""
    return 0.0 if peer is None else peer.skew


def _earlier(
    new: Mapping[str, Any], new_skew: float | None, old: Mapping[str, Any], old_skew: float | None
) -> bool:
    """Whether failure `new` ended before `old`, where both hosts' clocks allow saying so (each
    measured and within CLOCK_TOLERANCE of the master's); else arrival order stands."""
    ends = (new.get("ended_at"), old.get("ended_at"))
    skews = (new_skew, old_skew)
    if any(not isinstance(end, int | float) for end in ends) or any(s is None for s in skews):
        return False
    if any(abs(s) > CLOCK_TOLERANCE for s in skews if s is not None):
        return False
    return float(new["ended_at"]) + float(new_skew or 0) < float(old["ended_at"]) + float(
        old_skew or 0
    )


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


# -- every host -----------------------------------------------------------------------------

_KEY_ADVICE = (
    f"every host must derive the same job key: the same job and config files, and "
    f"{JOB_SECRET_ENV} set to the same value on every host or on none"
)


class Member:
    """Runs in every host's bootstrap (the master's too): joins, hears aborts, posts failures,
    and watches the master's heartbeat while sending its own. Nothing from the master counts
    before its welcome proved it holds the job's key."""

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
        self.key = key
        self.nonce = _nonce()  # this host's challenge to the master
        self.master_nonce: str | None = None
        self.trusted = False  # the master proved it holds the key
        self.refused: str | None = None  # why the join cannot be (in words), if so
        self.sock: socket.socket | None = None
        self.started = threading.Event()
        self.abort: RankRecord | None = None  # the failure another host relayed
        self.aborted_at: float | None = None  # when it arrived (this host's clock)
        self.first: RankRecord | None = None  # the job's first failure, as the master decided
        self.decided = threading.Event()
        self.lost_master = False  # the master's bootstrap went away before we finished
        self.lost_reason: str | None = None  # how: "no heartbeat for 10 s", "closed", ...
        self.aborted = threading.Event()  # either of the two
        self.finished = False
        self.posted = False  # this host told the others why it failed
        self.waiting_for: list[str] = []  # hosts the master still waited for at its last beat
        self.waiting_count = 0
        self.heard = 0.0
        self.idle: Callable[[], float] | None = None  # set while this host's job runs
        self.quota = _Quota()
        self._send_lock = threading.Lock()
        self._joined = False  # our join went out (nothing else goes before it)

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
        lines = _Lines(MEMBER_LINE_LIMIT)
        last_sent = time.monotonic()
        reason = "closed"
        while not self.finished and not self.refused:
            now = time.monotonic()
            if self._joined and now - last_sent >= self.interval:
                idle = self.idle
                self._send({"type": "beat", "idle": _idle(idle), "time": time.time()})
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
            for item in lines.feed(chunk):
                try:
                    if isinstance(item, Invalid):
                        raise item
                    self._handle(to_member(parse(item)))
                except Invalid as error:
                    self.quota.log(f"ignored a message from the master host {self.master}: {error}")
                except Exception as error:  # a defect of ours must not end the listening
                    self.quota.log(f"internal error: {type(error).__name__}: {error}")
                if self.refused:
                    break
        if self.refused:  # said by join(), which raises it
            self.lost_master = True
            self.lost_reason = "refused"
            self.aborted.set()
        elif not self.finished and not self.aborted.is_set():
            self.lost_master = True
            self.lost_reason = reason
            log(f"the master host {self.master} {self._lost_words()}: stopping this host")
            self.aborted.set()
        if not self.finished:  # a silent master gets no more of our beats
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _handle(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if not self.trusted:
            self._before_welcome(message)
        elif kind == "start":
            self.machines = dict(message["machines"])
            self.started.set()
        elif kind == "abort":
            self.abort = RankRecord.from_json(message["failure"])
            self.aborted_at = time.time()
            self.aborted.set()
        elif kind == "first":
            self.first = RankRecord.from_json(message["failure"])
            self.decided.set()
        elif kind == "beat" and "waiting" in message:
            self.waiting_for = list(message["waiting"] or [])
            self.waiting_count = int(message.get("waiting_count") or 0)

    def _before_welcome(self, message: dict[str, Any]) -> None:
        """The handshake: answer the hello with a proven join, check the master's welcome."""
        kind = message["type"]
        if kind == "hello" and self.master_nonce is None:
            if message["version"] != PROTOCOL:
                self.refused = (
                    f"the side channel at {self.master}:{self.port} speaks protocol "
                    f"{message['version']}, this host {PROTOCOL}: every host must run the same "
                    "image"
                )
                return
            self.master_nonce = message["nonce"]
            proof = join_proof(
                self.key, self.master_nonce, self.nonce, self.host, self.machine, self.workers
            )
            join = {
                "type": "join",
                "host": self.host,
                "machine": self.machine,
                "workers": self.workers,
                "nonce": self.nonce,
                "proof": proof,
            }
            self._joined = True
            self._send(join)
        elif kind == "welcome" and self.master_nonce is not None:
            expected = welcome_proof(self.key, self.nonce, self.master_nonce, self.host)
            if _same(expected, message["proof"]):
                self.trusted = True
            else:
                self.refused = (
                    f"the side channel at {self.master}:{self.port} is not this job's master "
                    f"(its proof is wrong): {_KEY_ADVICE}"
                )
        elif kind == "refused":
            reason = re.sub(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]", "?", message["reason"])
            self.refused = f"the master host {self.master} refused this host ({reason})"
            if "proof" in reason:
                self.refused += f": {_KEY_ADVICE}"
        elif kind != "beat":  # a proven join waits for its address check with plain beats
            self.quota.log(f"ignored {kind!r} from {self.master} before its welcome")

    def _send(self, message: dict[str, Any]) -> None:
        if self.sock is None or not self._joined:
            return
        with self._send_lock, contextlib.suppress(OSError):
            self.sock.sendall(_encode(message))

    def machine_share(self) -> tuple[int, int]:
        """(hosts, workers) of this job on this host's machine, as the master counted them."""
        hosts, workers = self.machines.get(self.machine or "", [1, self.workers])
        return int(hosts), int(workers)

    def post_failure(self, failure: RankRecord) -> None:
        """Tell the others why this host failed; once, and never to echo another's failure:
        after an abort only a rank's failure that ended before the abort arrived, which may
        still be the job's first (the master decides)."""
        if self.posted:
            return
        if self.aborted.is_set():
            arrived = self.aborted_at
            if failure.rank is None or failure.ended_at is None or arrived is None:
                return
            if failure.ended_at > arrived:
                return
        self.posted = True
        self._send({"type": "failed", "failure": fitted(failure.relayed())})

    def first_failure(self, timeout: float) -> RankRecord | None:
        """The job's first failure as the master decided it, waiting up to `timeout` for its
        word (it answers every post within a round trip)."""
        self.decided.wait(timeout)
        return self.first

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


def _idle(idle: Callable[[], float] | None) -> float | None:
    """This host's ranks' silence for the beat, within the schema (None: no job running)."""
    if idle is None:
        return None
    value = idle()
    return min(max(float(value), 0.0), 1e12) if math.isfinite(value) else None
