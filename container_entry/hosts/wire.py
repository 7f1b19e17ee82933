"""The side channel's wire format: newline-delimited JSON objects, one message a line, its
"type" a `MessageKind`. Lines are bounded at both ends, so a peer can never make the other keep an
unbounded line; what is not one JSON object is `Invalid`, never an exception of another kind."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any

PROTOCOL = 1  # the hello's version: hosts of different images refuse each other at the join
LINE_LIMIT = 64 * 1024  # bytes in one line to the master (or pending without a newline)
MEMBER_LINE_LIMIT = 1 << 20  # to a member (the start's machine map grows with the hosts)


class MessageKind(enum.StrEnum):
    """A message's "type", as sent: a MessageKind is its string on the wire and equals it, so a
    received "type" compares with a MessageKind as it is (messages.to_master / to_member check it).
    Which kinds go which way: messages.ToMaster and messages.ToMember."""

    HELLO = "hello"  # master -> a new connection, at once: the protocol and its challenge
    JOIN = "join"  # member -> master: who it is, its own challenge, its proof
    WELCOME = "welcome"  # master -> member: admitted, with the master's proof
    REFUSED = "refused"  # master -> a connection it closes: why
    START = "start"  # master -> every host: all joined, and who shares which machine
    BEAT = "beat"  # both ways every interval: a member's idle time and clock; who is missing
    FAILED = "failed"  # member -> master: this host's failure
    ABORT = "abort"  # master -> every host but the poster: the job failed, stop now
    FIRST = "first"  # master -> every host: the job's first failure as decided (may change
    # until it says final)
    SETTLED = "settled"  # member -> master: this host posted every failure of its own that may
    # be the job's first
    DONE = "done"  # member -> master: this host finished
    RECORDS = "records"  # member -> master: after a hang, its ranks' collective records
    CULPRIT = "culprit"  # master -> every host: the hang's culprit, from every host's records
    ARRIVALS = "arrivals"  # member -> master, every straggler interval: its ranks' collective
    # entry times (diagnose/arrivals.py)


class Invalid(ValueError):
    """A line or message that does not follow the protocol; the text says how."""


class Lines:
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


def encode(message: Mapping[str, Any]) -> bytes:
    """One message as its line (a MessageKind goes out as its plain string), compact: the size
    the senders budget for (a straggler summary, diagnose/arrivals.encoded) is the size sent."""
    return (json.dumps(message, separators=(",", ":")) + "\n").encode()
